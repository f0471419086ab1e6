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
//	             starts, and every wait under way at the end is granted
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
	mon := startMonitor(b, s.Addr)
	startBy, startCmds := scriptCalls(b, s)
	mon.take(b, s.Addr, 0)
	var (
		grants     atomic.Int64
		releasedAt atomic.Int64 // unix ns of the last release's start; 0 = none
		mu         sync.Mutex
		wakes      []time.Duration
		per        = make([]int64, procs)
		wg         sync.WaitGroup
		firstErr   atomic.Value
		target     = int64(b.N)
	)
	b.ResetTimer()
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
				n := grants.Add(1)
				if n <= target {
					per[i]++
				}
				time.Sleep(hold) // the critical section
				releasedAt.Store(time.Now().UnixNano())
				_ = lk.Release(context.Background())
				if n >= target {
					// Done; those still waiting are granted in turn, so
					// no wait is cut short (a cancelled wait's LEAVE is
					// not part of an acquisition).
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	got := mon.take(b, s.Addr, 1)
	calls := len(got)
	byName := map[string]int{}
	for _, c := range got {
		byName[c]++
	}
	b.Logf("client commands: %v", byName)
	endBy, endCmds := scriptCalls(b, s)
	cmds := endCmds - startCmds
	for name, c := range endBy {
		endBy[name] = c - startBy[name]
	}
	b.Logf("server commands: %v", endBy)
	n := float64(grants.Load())
	slices.Sort(wakes)
	lo, hi := slices.Min(per), slices.Max(per)
	b.ReportMetric(float64(calls)/n, "calls/acq")
	b.ReportMetric(float64(cmds)/n, "server-cmds/acq")
	b.ReportMetric(float64(lo)/float64(max(hi, 1)), "fairness")
	if len(wakes) > 0 {
		b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds()), "wake-p50-us")
	}
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
