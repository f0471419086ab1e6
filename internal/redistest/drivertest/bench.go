package drivertest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
)

// scriptCalls reads INFO commandstats: the calls of every command except
// INFO and ECHO, by name (what the server executed, script internals
// included), and their sum.
func scriptCalls(b testing.TB, s *redistest.Server) (map[string]int64, int64) {
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	by := map[string]int64{}
	var n int64
	for _, line := range strings.Split(v.(string), "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" || name == "cmdstat_echo" {
			continue
		}
		c, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		by[strings.TrimPrefix(name, "cmdstat_")] = c
		n += c
	}
	return by, n
}

// Contention benchmarks procs Lockers, each its own locker.Locker as
// separate processes would be, contending for one key on server s through
// dsn: each takes the key, holds it for hold, releases it, and goes again,
// b.N acquisitions in all. It reports
//
//	calls/acq    commands the clients sent per acquisition (MONITOR; script
//	             internals and PING/CLIENT/HELLO left out), in the steady
//	             state: every Locker has waited once before the count
//	             starts, and every wait under way at the end is granted;
//	             counted in a second pass of b.N acquisitions, since
//	             MONITOR slows the server (the other metrics come from the
//	             first pass, without it)
//	server-cmds/acq  every command the server ran per acquisition, script
//	             internals included (INFO commandstats)
//	fairness     fewest/most acquisitions of one Locker (1 = equal shares)
//	wake-p50-us  median time from the start of a release to the next grant
func Contention(b *testing.B, s *redistest.Server, dsn string, procs int, hold time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lockers := make([]*locker.Locker, procs)
	for i := range lockers {
		l, err := locker.OpenURL(dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		lockers[i] = l
	}
	// Warm up every Locker (connections, scripts, subscriptions): one
	// round in which all but the first wait, so each has subscribed its
	// wake channel, as a long-lived process would have.
	first, err := lockers[0].Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
	if err != nil {
		b.Fatal(err)
	}
	var warm sync.WaitGroup
	warmErr := make(chan error, procs)
	for _, l := range lockers[1:] {
		warm.Go(func() {
			lk, err := l.Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
			if err != nil {
				warmErr <- err
				return
			}
			time.Sleep(hold) // the watch's first read starts its tracker
			_ = lk.Release(ctx)
		})
	}
	barging := strings.Contains(dsn, "fair=false")
	waitQueued(b, s, barging, procs-1)
	_ = first.Release(ctx)
	warm.Wait()
	close(warmErr)
	if err := <-warmErr; err != nil {
		b.Fatal(err)
	}
	// The first Locker has not waited yet: it waits behind the second.
	second, err := lockers[1].Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
	if err != nil {
		b.Fatal(err)
	}
	firstWait := make(chan error, 1)
	go func() {
		lk, err := lockers[0].Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		if err == nil {
			err = lk.Release(ctx)
		}
		firstWait <- err
	}()
	waitQueued(b, s, barging, 1)
	_ = second.Release(ctx)
	if err := <-firstWait; err != nil {
		b.Fatal(err)
	}
	// Pass one is measured: time, fairness, wakes and the server's
	// commands. Pass two repeats it under MONITOR to count the clients'
	// calls: MONITOR makes the server copy every command, script internals
	// included, to the monitoring connection, which slows the handoffs it
	// watches.
	startBy, startCmds := scriptCalls(b, s)
	b.ResetTimer()
	per, wakes, grants, err := contend(ctx, lockers, b.N, hold)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	endBy, endCmds := scriptCalls(b, s)
	cmds := endCmds - startCmds
	for name, c := range endBy {
		endBy[name] = c - startBy[name]
	}
	b.Logf("server commands: %v", endBy)
	mon := startMonitor(b, s.Addr)
	mon.take(b, s.Addr, 0)
	_, _, monGrants, err := contend(ctx, lockers, b.N, hold)
	if err != nil {
		b.Fatal(err)
	}
	got := mon.take(b, s.Addr, 1)
	byName := map[string]int{}
	for _, c := range got {
		byName[c]++
	}
	b.Logf("client commands: %v", byName)
	slices.Sort(wakes)
	lo, hi := slices.Min(per), slices.Max(per)
	b.ReportMetric(float64(len(got))/float64(monGrants), "calls/acq")
	b.ReportMetric(float64(cmds)/float64(grants), "server-cmds/acq")
	b.ReportMetric(float64(lo)/float64(max(hi, 1)), "fairness")
	if len(wakes) > 0 {
		b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds()), "wake-p50-us")
	}
}

// contend runs one pass of Contention: every Locker takes "hot", holds it
// for hold, releases it and goes again, until target acquisitions were
// made; the waits under way then are granted in turn, not cut short (a
// cancelled wait's LEAVE is not part of an acquisition). It returns each
// Locker's share of the first target acquisitions, the time from each
// release's start to the next grant, and the acquisitions made in all.
func contend(ctx context.Context, lockers []*locker.Locker, target int, hold time.Duration) (per []int64, wakes []time.Duration, grants int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		n          atomic.Int64
		releasedAt atomic.Int64 // unix ns of the last release's start; 0 = none
		mu         sync.Mutex
		wg         sync.WaitGroup
		firstErr   atomic.Value
	)
	per = make([]int64, len(lockers))
	for i, l := range lockers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lk, err := l.Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
				if err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
						cancel()
					}
					return
				}
				now := time.Now().UnixNano()
				if r := releasedAt.Swap(0); r != 0 {
					mu.Lock()
					wakes = append(wakes, time.Duration(now-r))
					mu.Unlock()
				}
				k := n.Add(1)
				if k <= int64(target) {
					per[i]++
				}
				time.Sleep(hold) // the critical section
				releasedAt.Store(time.Now().UnixNano())
				_ = lk.Release(context.Background())
				if k >= int64(target) {
					return
				}
			}
		})
	}
	wg.Wait()
	if e, _ := firstErr.Load().(error); e != nil {
		return nil, nil, 0, e
	}
	return per, wakes, n.Load(), nil
}

// waitQueued waits until n waiters stand in the fair queue of "hot" on s.
// Barging waiters leave no trace on the server that is common to both
// clients (go-redis subscribes to the key's channel, rueidis tracks the key
// for client-side caching), so for them it waits until n clients subscribed
// to the channel or 500ms passed: a warm-up that is not complete only moves
// a subscription into the measured part.
func waitQueued(b *testing.B, s *redistest.Server, barging bool, n int) {
	deadline := time.Now().Add(10 * time.Second)
	if barging {
		deadline = time.Now().Add(500 * time.Millisecond)
	}
	for {
		var c int64
		if barging {
			v, err := s.Do("PUBSUB", "NUMSUB", "locker:{hot}")
			if err != nil {
				b.Fatal(err)
			}
			if a, _ := v.([]any); len(a) == 2 {
				c, _ = a[1].(int64)
			}
		} else {
			v, err := s.Do("LLEN", "locker:{hot}:q")
			if err != nil {
				b.Fatal(err)
			}
			c, _ = v.(int64)
		}
		if c >= int64(n) {
			return
		}
		if time.Now().After(deadline) {
			if barging {
				return
			}
			b.Fatalf("%d of %d waiters queued after 10s", c, n)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition with a deadline
	}
}
