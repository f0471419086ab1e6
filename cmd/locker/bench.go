package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/go-locker/locker"
)

type benchOpts struct {
	common
	workers  int
	duration time.Duration
	hold     time.Duration
	ttl      time.Duration
	key      string
}

// benchResult is what the workers measured.
type benchResult struct {
	mu          sync.Mutex
	acquire     []time.Duration // Acquire call to grant, every grant
	handoff     []time.Duration // previous holder's release to this grant, when this one waited
	lastToken   uint64
	lastRelease time.Time
	overlaps    int
	regressions int
	errs        int
	firstErr    error
	holders     atomic.Int32
}

func cmdBench(args []string, stdout, stderr io.Writer) int {
	var o benchOpts
	fs := newFlags("bench", stderr, &o.common)
	fs.IntVar(&o.workers, "workers", 4, "contending workers, each with its own connection (`N` >= 1)")
	fs.DurationVar(&o.duration, "duration", 5*time.Second, "how long to run")
	fs.DurationVar(&o.hold, "hold", 0, "how long each worker holds the lock")
	fs.DurationVar(&o.ttl, "ttl", 10*time.Second, "lock TTL")
	fs.StringVar(&o.key, "key", "", "key to contend on (default: a random locker-bench-… key)")
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintln(stdout, "usage: locker bench [flags]")
			fs.PrintDefaults()
			return exitOK
		}
		o.errorf("bench: %v (see locker bench -h)", err)
		return exitUsage
	}
	fs.SetOutput(stderr)
	switch {
	case fs.NArg() != 0:
		o.errorf("bench: unexpected argument %q (see locker bench -h)", fs.Arg(0))
		return exitUsage
	case o.workers < 1:
		o.errorf("bench: --workers must be at least 1, got %d", o.workers)
		return exitUsage
	case o.duration <= 0:
		o.errorf("bench: --duration must be positive, got %v", o.duration)
		return exitUsage
	case o.hold < 0:
		o.errorf("bench: --hold must not be negative, got %v", o.hold)
		return exitUsage
	case o.ttl <= 0:
		o.errorf("bench: --ttl must be positive, got %v", o.ttl)
		return exitUsage
	}
	if o.key == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.key = "locker-bench-" + hex.EncodeToString(b[:])
	}
	lockers := make([]*locker.Locker, o.workers)
	for i := range lockers {
		l, err := o.open(context.Background())
		if err != nil {
			o.errorf("bench: %v", err)
			for _, l := range lockers[:i] {
				l.Close()
			}
			return failCode(err)
		}
		lockers[i] = l
	}
	o.logf("%d workers contending on %q for %v", o.workers, o.key, o.duration)
	res := &benchResult{}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration)
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range lockers {
		wg.Go(func() { o.worker(ctx, l, res) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel()
	for _, l := range lockers {
		l.Close()
	}
	o.report(stdout, res, elapsed)
	if res.overlaps > 0 || res.regressions > 0 {
		o.errorf("bench: mutual exclusion violated: %d overlaps, %d token regressions", res.overlaps, res.regressions)
		return exitFree
	}
	return exitOK
}

func (o *benchOpts) worker(ctx context.Context, l *locker.Locker, res *benchResult) {
	for ctx.Err() == nil {
		t0 := time.Now()
		lk, err := l.Acquire(ctx, o.key, locker.WithTTL(o.ttl))
		t1 := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				res.mu.Lock()
				res.errs++
				if res.firstErr == nil {
					res.firstErr = err
				}
				res.mu.Unlock()
			}
			continue
		}
		if res.holders.Add(1) != 1 {
			res.mu.Lock()
			res.overlaps++
			res.mu.Unlock()
		}
		res.mu.Lock()
		if lk.Token() <= res.lastToken {
			res.regressions++
		}
		res.lastToken = lk.Token()
		res.acquire = append(res.acquire, t1.Sub(t0))
		if !res.lastRelease.IsZero() && res.lastRelease.After(t0) {
			res.handoff = append(res.handoff, t1.Sub(res.lastRelease))
		}
		res.mu.Unlock()
		if o.hold > 0 {
			time.Sleep(o.hold) // the work done under the lock
		}
		res.holders.Add(-1)
		res.mu.Lock()
		res.lastRelease = time.Now()
		res.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		if err := lk.Release(rctx); err != nil {
			res.mu.Lock()
			res.errs++
			if res.firstErr == nil {
				res.firstErr = err
			}
			res.mu.Unlock()
		}
		cancel()
	}
}

func (o *benchOpts) report(w io.Writer, res *benchResult, elapsed time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "backend %s, key %q: %d workers for %v, hold %v, ttl %v\n\n",
		redact(o.url), o.key, o.workers, elapsed.Round(time.Millisecond), o.hold, o.ttl)
	fmt.Fprintln(tw, "\tsamples\tp50\tp99\tmax\t")
	row := func(name string, d []time.Duration) {
		if len(d) == 0 {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\t\n", name)
			return
		}
		slices.Sort(d)
		fmt.Fprintf(tw, "%s\t%d\t%v\t%v\t%v\t\n", name, len(d), pct(d, 50), pct(d, 99), round(d[len(d)-1]))
	}
	row("acquire", res.acquire)
	row("handoff", res.handoff)
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "throughput\t%.1f acquisitions/s (%d in %v)\n", float64(len(res.acquire))/elapsed.Seconds(), len(res.acquire), elapsed.Round(time.Millisecond))
	if res.overlaps == 0 && res.regressions == 0 {
		fmt.Fprintf(tw, "violations\tnone (0 overlaps, 0 token regressions)\n")
	} else {
		fmt.Fprintf(tw, "violations\t%d overlaps, %d token regressions\n", res.overlaps, res.regressions)
	}
	if res.errs > 0 {
		fmt.Fprintf(tw, "errors\t%d (first: %s)\n", res.errs, oneLine(res.firstErr.Error()))
	} else {
		fmt.Fprintf(tw, "errors\t0\n")
	}
	tw.Flush()
}

// pct returns the p-th percentile of sorted d, rounded for display.
func pct(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	i = min(max(i-1, 0), len(d)-1)
	return round(d[i])
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}
