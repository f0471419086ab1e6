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

// scriptCalls sums the calls of every command in INFO commandstats except
// INFO and ECHO: what the server executed, script internals included.
func scriptCalls(b testing.TB, s *redistest.Server) int64 {
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(v.(string), "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" || name == "cmdstat_echo" {
			continue
		}
		c, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		n += c
	}
	return n
}

// Contention benchmarks procs Lockers, each its own locker.Locker as
// separate processes would be, contending for one key on server s through
// dsn: each takes the key, holds it for hold, releases it, and goes again,
// b.N acquisitions in all. It reports
//
//	calls/acq    commands the clients sent per acquisition (MONITOR; script
//	             internals and PING/CLIENT/HELLO left out)
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
	// Warm up every Locker (connections, scripts, subscriptions).
	for _, l := range lockers {
		lk, err := l.Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		if err != nil {
			b.Fatal(err)
		}
		_ = lk.Release(ctx)
	}
	mon := startMonitor(b, s.Addr)
	mon.take(b, s.Addr, 0)
	startCmds := scriptCalls(b, s)
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
					cancel()
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
	cmds := scriptCalls(b, s) - startCmds
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
