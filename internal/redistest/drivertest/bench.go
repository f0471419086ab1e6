package drivertest

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/contendtest"
	"github.com/go-locker/locker/internal/rediscore"
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
//	             over the first whole rounds (a multiple of procs)
//	wake-p50-us  median time from the start of a release to the next grant
func Contention(b *testing.B, s *redistest.Server, dsn string, procs int, hold time.Duration) {
	contention(b, s, dsn, procs, hold, contender{slots: 1, queue: "locker:{hot}:q",
		acquire: func(ctx context.Context, l *locker.Locker) (*locker.Lock, error) {
			return l.Acquire(ctx, "hot", locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		}})
}

// SemaphoreContention is Contention for the permits of a semaphore of n
// on "hot": at most n Lockers hold at once, and the others wait in the
// semaphore's queue. wake-p50-us is then the time from the start of a
// release to the next grant, whichever holder released.
func SemaphoreContention(b *testing.B, s *redistest.Server, dsn string, procs, n int, hold time.Duration) {
	contention(b, s, dsn, procs, hold, contender{slots: n, queue: rediscore.SharedKeys("", "hot", driver.SharedPermit)[3],
		acquire: func(ctx context.Context, l *locker.Locker) (*locker.Lock, error) {
			return l.Semaphore("hot", n).Acquire(ctx, locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		}})
}

// contender is what Contention contends for: acquire takes it, at most
// slots Lockers hold it at once, and queue is the list its waiters stand
// in on the server.
type contender struct {
	acquire func(context.Context, *locker.Locker) (*locker.Lock, error)
	slots   int
	queue   string
}

func contention(b *testing.B, s *redistest.Server, dsn string, procs int, hold time.Duration, k contender) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if procs < 2*k.slots {
		b.Fatalf("%d processes for %d slots: need at least %d", procs, k.slots, 2*k.slots)
	}
	lockers := make([]*locker.Locker, procs)
	for i := range lockers {
		l, err := locker.OpenURL(dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		lockers[i] = l
	}
	barging := strings.Contains(dsn, "fair=false")
	// Warm up every Locker (connections, scripts, subscriptions): one
	// round in which the first slots hold and the others wait, so each has
	// subscribed its wake channel, as a long-lived process would have; then
	// one in which the next slots hold and the first wait.
	warmRound(ctx, b, s, k, lockers[:k.slots], lockers[k.slots:], barging, hold)
	warmRound(ctx, b, s, k, lockers[k.slots:2*k.slots], lockers[:k.slots], barging, hold)
	// Pass one is measured: time, fairness, wakes and the server's
	// commands. Pass two repeats it under MONITOR to count the clients'
	// calls: MONITOR makes the server copy every command, script internals
	// included, to the monitoring connection, which slows the handoffs it
	// watches.
	startBy, startCmds := scriptCalls(b, s)
	b.ResetTimer()
	per, wakes, grants, err := contendtest.Pass(ctx, lockers, b.N, hold, k.acquire)
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
	_, _, monGrants, err := contendtest.Pass(ctx, lockers, b.N, hold, k.acquire)
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

// warmRound has holders take k, waiters wait for it (each holding it for
// hold once granted, then releasing), and, once every waiter is queued on
// the server, the holders release.
func warmRound(ctx context.Context, b *testing.B, s *redistest.Server, k contender, holders, waiters []*locker.Locker, barging bool, hold time.Duration) {
	held := make([]*locker.Lock, 0, len(holders))
	for _, l := range holders {
		lk, err := k.acquire(ctx, l)
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, lk)
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(waiters))
	for _, l := range waiters {
		wg.Go(func() {
			lk, err := k.acquire(ctx, l)
			if err != nil {
				errs <- err
				return
			}
			time.Sleep(hold) // the watch's first read starts its tracker
			errs <- lk.Release(ctx)
		})
	}
	waitQueued(b, s, k.queue, barging, len(waiters))
	for _, lk := range held {
		_ = lk.Release(ctx)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// waitQueued waits until n waiters stand in the fair queue of "hot" on s.
// Barging waiters leave no trace on the server that is common to both
// clients (go-redis subscribes to the key's channel, rueidis tracks the key
// for client-side caching), so for them it waits until n clients subscribed
// to the channel or 500ms passed: a warm-up that is not complete only moves
// a subscription into the measured part.
func waitQueued(b *testing.B, s *redistest.Server, queue string, barging bool, n int) {
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
			v, err := s.Do("LLEN", queue)
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
