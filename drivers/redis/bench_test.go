package redis

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// seedRelease is the article's compare-and-delete script: the raw client's
// release, the floor the driver is compared with.
var seedRelease = goredis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

// BenchmarkAcquireRelease compares, in one run against one server, an
// uncontended acquire+release through the raw go-redis client (SET NX PX +
// EVALSHA of the release script: the floor), through the driver (one
// EVALSHA each way, fencing token and wake-up included), and through
// package locker.
func BenchmarkAcquireRelease(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()

	b.Run("raw-go-redis", func(b *testing.B) {
		c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
		defer c.Close()
		if err := seedRelease.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			ok, err := c.SetNX(ctx, "raw", "owner", 30*time.Second).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			if n, err := seedRelease.EvalSha(ctx, c, []string{"raw"}, "owner").Int(); err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("driver", func(b *testing.B) {
		l := openT(b, s.URL())
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := l.Acquire(ctx, "drv", "owner", 30*time.Second); err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, "drv", "owner"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("driver-cancellable-ctx", func(b *testing.B) {
		l := openT(b, s.URL())
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := l.Acquire(cctx, "drvc", "owner", 30*time.Second); err != nil {
				b.Fatal(err)
			}
			if err := l.Release(cctx, "drvc", "owner"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("locker", func(b *testing.B) {
		l, err := locker.OpenURL(s.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "lk", locker.WithTTL(30*time.Second))
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAcquireReleaseInterleaved runs the floor and the driver
// alternately in one loop (one op = one acquire+release of each), so that
// the load of a shared machine hits both equally, and reports the mean of
// each (raw-ns, driver-ns) and their ratio (driver/raw).
func BenchmarkAcquireReleaseInterleaved(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
	defer c.Close()
	if err := seedRelease.Load(ctx, c).Err(); err != nil {
		b.Fatal(err)
	}
	l := openT(b, s.URL())
	var raw, drv time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if ok, err := c.SetNX(ctx, "raw", "owner", 30*time.Second).Result(); err != nil || !ok {
			b.Fatal(ok, err)
		}
		if n, err := seedRelease.EvalSha(ctx, c, []string{"raw"}, "owner").Int(); err != nil || n != 1 {
			b.Fatal(n, err)
		}
		t1 := time.Now()
		if _, err := l.Acquire(ctx, "drv", "owner", 30*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, "drv", "owner"); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		raw += t1.Sub(t0)
		drv += t2.Sub(t1)
	}
	b.ReportMetric(float64(raw.Nanoseconds())/float64(b.N), "raw-ns")
	b.ReportMetric(float64(drv.Nanoseconds())/float64(b.N), "driver-ns")
	b.ReportMetric(float64(drv)/float64(raw), "driver/raw")
}

// BenchmarkCancellableContext measures what honouring a context's
// cancellation costs on go-redis, which does not return when a context is
// cancelled: a call on a context that can be cancelled runs on a worker
// goroutine while its caller waits for it or for the context. One op is
// one driver acquire+release on context.Background() and one on a context
// that can be cancelled (as package locker's always can: Close cuts short
// the calls under way), alternately in one loop; it reports the mean of
// each (bg-ns, cancellable-ns), their ratio and each pair's allocations.
func BenchmarkCancellableContext(b *testing.B) {
	l := openT(b, redistest.Start(b).URL())
	bg := context.Background()
	cctx, cancel := context.WithCancel(bg)
	defer cancel()
	pair := func(ctx context.Context) {
		if _, err := l.Acquire(ctx, "k", "owner", 30*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, "k", "owner"); err != nil {
			b.Fatal(err)
		}
	}
	var plain, cut time.Duration
	for b.Loop() {
		t0 := time.Now()
		pair(bg)
		t1 := time.Now()
		pair(cctx)
		plain += t1.Sub(t0)
		cut += time.Since(t1)
	}
	b.ReportMetric(float64(plain.Nanoseconds())/float64(b.N), "bg-ns")
	b.ReportMetric(float64(cut.Nanoseconds())/float64(b.N), "cancellable-ns")
	b.ReportMetric(float64(cut)/float64(plain), "cancellable/bg")
	b.ReportMetric(testing.AllocsPerRun(200, func() { pair(bg) }), "bg-allocs")
	b.ReportMetric(testing.AllocsPerRun(200, func() { pair(cctx) }), "cancellable-allocs")
}

// BenchmarkRoundTrip is one PING: the unit the handoff is measured in.
func BenchmarkRoundTrip(b *testing.B) {
	s := redistest.Start(b)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, DisableIdentity: true})
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// totalCalls sums the calls of every command in INFO commandstats except
// INFO itself (commands run inside scripts included), and returns the
// EVALSHA calls (the round trips of the lock protocol) too.
func totalCalls(b *testing.B, s *redistest.Server) (all, evalsha int64) {
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(v.(string), "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || name == "cmdstat_info" {
			continue
		}
		c, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		n += c
		if name == "cmdstat_evalsha" {
			evalsha = c
		}
	}
	return n, evalsha
}

// BenchmarkHandoff: contenders fight for one key and hold it 5ms each time:
// 8 (or 2) lockers, each its own locker.Locker as separate processes would
// be, or 8 goroutines sharing one locker.Locker. One op is one handoff. Reported: handoff-us, the time from the start of the
// holder's Release to the next holder's grant (to compare with rtt-us, one
// PING measured in the same run); cmds/handoff, every command the server
// executed (INFO commandstats) divided by the handoffs.
func BenchmarkHandoff(b *testing.B) {
	for _, m := range []struct {
		name             string
		redlock          bool
		lockers, perLock int
	}{
		{"8-processes", false, 8, 1},
		{"1-process-8-waiters", false, 1, 8},
		{"2-processes", false, 2, 1},
		{"redlock3-8-processes", true, 8, 1},
	} {
		b.Run(m.name, func(b *testing.B) {
			var servers []*redistest.Server
			var dsn string
			if !m.redlock {
				servers = []*redistest.Server{redistest.Start(b)}
				dsn = servers[0].URL()
			} else {
				servers = redistest.StartN(b, 3)
				addrs := []string{}
				for _, s := range servers {
					addrs = append(addrs, s.Addr)
				}
				dsn = urlOf(addrs...) + "?node_timeout=200ms"
			}
			benchHandoff(b, servers, dsn, m.lockers, m.perLock, 5*time.Millisecond)
		})
	}
}

// pubsubFloor is the raw go-redis floor of a pub/sub handoff: a holder
// client that runs the release script and PUBLISHes, and a waiter blocked
// in Receive on its own subscriber connection that takes the key with SET
// NX PX when told.
type pubsubFloor struct {
	holder *goredis.Client
	got    chan time.Time // when the waiter's SET NX returned
}

func newPubsubFloor(b *testing.B, s *redistest.Server) *pubsubFloor {
	ctx := context.Background()
	holder := goredis.NewClient(&goredis.Options{Addr: s.Addr, DisableIdentity: true})
	b.Cleanup(func() { holder.Close() })
	waiter := goredis.NewClient(&goredis.Options{Addr: s.Addr, DisableIdentity: true})
	b.Cleanup(func() { waiter.Close() })
	ps := waiter.Subscribe(ctx, "floor")
	b.Cleanup(func() { ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the subscribe confirmation
		b.Fatal(err)
	}
	if err := seedRelease.Load(ctx, holder).Err(); err != nil {
		b.Fatal(err)
	}
	f := &pubsubFloor{holder: holder, got: make(chan time.Time)}
	go func() {
		for {
			if _, err := ps.ReceiveMessage(ctx); err != nil {
				close(f.got)
				return
			}
			if err := waiter.SetNX(ctx, "floorkey", "w", 10*time.Second).Err(); err != nil {
				b.Error(err)
			}
			f.got <- time.Now()
		}
	}()
	return f
}

// handoff takes the key as the holder, holds it 5ms, then releases and
// publishes; it returns the time from the release's start to the waiter's
// grant.
func (f *pubsubFloor) handoff(b *testing.B) time.Duration {
	ctx := context.Background()
	if err := f.holder.Set(ctx, "floorkey", "h", 10*time.Second).Err(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // the critical section
	t0 := time.Now()
	if err := seedRelease.EvalSha(ctx, f.holder, []string{"floorkey"}, "h").Err(); err != nil {
		b.Fatal(err)
	}
	if err := f.holder.Publish(ctx, "floor", "1").Err(); err != nil {
		b.Fatal(err)
	}
	return (<-f.got).Sub(t0)
}

// BenchmarkHandoffFloor is the raw go-redis floor of a pub/sub handoff,
// measured like BenchmarkHandoff (see pubsubFloor). One op is one handoff;
// handoff-us (mean) and handoff-p50-us are from the release's start to the
// waiter's grant.
func BenchmarkHandoffFloor(b *testing.B) {
	f := newPubsubFloor(b, redistest.Start(b))
	var (
		sum   time.Duration
		times []time.Duration
	)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		d := f.handoff(b)
		sum += d
		times = append(times, d)
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(sum.Nanoseconds())/float64(b.N)/1e3, "handoff-us")
	b.ReportMetric(float64(times[len(times)/2].Microseconds()), "handoff-p50-us")
}

// BenchmarkHandoffFair measures one fair-queue handoff like
// BenchmarkHandoffFloor, interleaved with it in one loop: two Lockers take
// turns, one holding "hot" for 5ms while the other waits queued (the
// holder releases only once the waiter stands in the queue), and the time
// is from the release's start to the waiter's Acquire returning through
// package locker. It reports both medians (fair-p50-us, floor-p50-us) and
// their ratio (fair/floor). Unlike BenchmarkQueue, nobody re-joins the
// queue during the handoff.
func BenchmarkHandoffFair(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	f := newPubsubFloor(b, s)
	var ls [2]*locker.Locker
	for i := range ls {
		l, err := locker.OpenURL(s.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ls[i] = l
	}
	opts := []locker.Option{locker.WithTTL(10 * time.Second), locker.WithAutoRenew(false)}
	cur, err := ls[0].Acquire(ctx, "hot", opts...)
	if err != nil {
		b.Fatal(err)
	}
	type result struct {
		lk  *locker.Lock
		at  time.Time
		err error
	}
	var floor, fair []time.Duration
	next := 1
	for b.Loop() {
		floor = append(floor, f.handoff(b))

		rc := make(chan result, 1)
		go func(l *locker.Locker) {
			lk, err := l.Acquire(ctx, "hot", opts...)
			rc <- result{lk, time.Now(), err}
		}(ls[next])
		for deadline := time.Now().Add(10 * time.Second); ; {
			v, err := s.Do("LLEN", "locker:{hot}:q")
			if err != nil {
				b.Fatal(err)
			}
			if n, _ := v.(int64); n == 1 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("the waiter did not join the queue within 10s")
			}
			time.Sleep(time.Millisecond) // polling a condition with a deadline
		}
		time.Sleep(5 * time.Millisecond) // the critical section
		t1 := time.Now()
		if err := cur.Release(ctx); err != nil {
			b.Fatal(err)
		}
		r := <-rc
		if r.err != nil {
			b.Fatal(r.err)
		}
		fair = append(fair, r.at.Sub(t1))
		cur, next = r.lk, 1-next
	}
	b.StopTimer()
	slices.Sort(floor)
	slices.Sort(fair)
	fp, qp := floor[len(floor)/2], fair[len(fair)/2]
	b.ReportMetric(float64(fp.Microseconds()), "floor-p50-us")
	b.ReportMetric(float64(qp.Microseconds()), "fair-p50-us")
	b.ReportMetric(float64(qp)/float64(fp), "fair/floor")
}

func benchHandoff(b *testing.B, servers []*redistest.Server, dsn string, contenders, perLocker int, hold time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lockers := make([]*locker.Locker, contenders)
	for i := range lockers {
		l, err := locker.OpenURL(dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		lockers[i] = l
	}
	c := goredis.NewClient(&goredis.Options{Addr: servers[0].Addr, DisableIdentity: true})
	defer c.Close()
	var rtt time.Duration
	for range 200 {
		start := time.Now()
		if err := c.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		rtt += time.Since(start)
	}
	rtt /= 200

	var (
		grants       atomic.Int64
		handoffSum   atomic.Int64
		handoffs     atomic.Int64
		releasedAt   atomic.Int64 // unix ns of the last release start; 0 = none
		releaseEnd   atomic.Int64 // unix ns of the last release's return
		afterSum     atomic.Int64
		wg           sync.WaitGroup
		target       = int64(b.N)
		startCalls   = make([]int64, len(servers))
		startEvalsha = make([]int64, len(servers))
		firstErr     atomic.Value
	)
	for i, s := range servers {
		startCalls[i], startEvalsha[i] = totalCalls(b, s)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range contenders * perLocker {
		l := lockers[i%contenders]
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
					handoffSum.Add(now - r)
					if e := releaseEnd.Load(); e >= r {
						afterSum.Add(now - e)
					} // else granted before the release call returned: 0
					handoffs.Add(1)
				}
				n := grants.Add(1)
				time.Sleep(hold) // the critical section
				last := n >= target+1
				releasedAt.Store(time.Now().UnixNano())
				_ = lk.Release(context.Background())
				releaseEnd.Store(time.Now().UnixNano())
				if last {
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
	var calls, evalsha int64
	for i, s := range servers {
		c, e := totalCalls(b, s)
		calls += c - startCalls[i]
		evalsha += e - startEvalsha[i]
	}
	h := max(handoffs.Load(), 1)
	b.ReportMetric(float64(handoffSum.Load())/float64(h)/1e3, "handoff-us")
	b.ReportMetric(float64(afterSum.Load())/float64(h)/1e3, "after-release-us")
	b.ReportMetric(float64(rtt.Nanoseconds())/1e3, "rtt-us")
	b.ReportMetric(float64(evalsha)/float64(h), "evalsha/handoff")
	b.ReportMetric(float64(calls)/float64(h), "cmds/handoff")
}

// BenchmarkQueue: separate Lockers (as separate processes) contending
// for one key, 5ms hold, with the fair queue (the default) and barging
// (fair=false), then for the permits of a semaphore of 4 (sem4-N); see drivertest.Contention for the metrics. Run with a fixed
// count, e.g. -benchtime 400x.
func BenchmarkQueue(b *testing.B) {
	s := redistest.Start(b)
	for _, mode := range []string{"fair", "barging"} {
		for _, procs := range []int{8, 32, 64} {
			b.Run(mode+"-"+strconv.Itoa(procs), func(b *testing.B) {
				dsn := s.URL()
				if mode == "barging" {
					dsn += "?fair=false"
				}
				drivertest.Contention(b, s, dsn, procs, 5*time.Millisecond)
			})
		}
	}
	// A semaphore of 4 under the same contention, in the same run.
	for _, procs := range []int{8, 32, 64} {
		b.Run("sem4-"+strconv.Itoa(procs), func(b *testing.B) {
			drivertest.SemaphoreContention(b, s, s.URL(), procs, 4, 5*time.Millisecond)
		})
	}
}
