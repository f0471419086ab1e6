package rueidis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// Benchmarks run against their own redis-server. Run them with
//
//	go test -run '^$' -bench . -benchtime 2000x ./drivers/rueidis/
//
// The floors are the raw client doing the same commands in the same run.

// rawRelease is the classic compare-and-delete script (the seed article's).
var rawRelease = rueidis.NewLuaScript(`if redis.call("GET",KEYS[1]) == ARGV[1] then return redis.call("DEL",KEYS[1]) end return 0`)

func benchServer(b *testing.B) *redistest.Server {
	b.Helper()
	return redistest.Start(b)
}

// BenchmarkUncontended: one acquire + one release per op, on one key.
func BenchmarkUncontended(b *testing.B) {
	s := benchServer(b)
	ctx := context.Background()
	const ttl = 10 * time.Second

	b.Run("floor=raw-rueidis-SETNX+release-script", func(b *testing.B) {
		cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true})
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		ms := strconv.FormatInt(ttl.Milliseconds(), 10)
		key, val := "raw:{k}", "owner-0123456789abcdef0123456789abcdef"
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := cl.Do(ctx, cl.B().Set().Key(key).Value(val).Nx().PxMilliseconds(ttl.Milliseconds()).Build()).Error(); err != nil {
				b.Fatal(err)
			}
			if n, err := rawRelease.Exec(ctx, cl, []string{key}, []string{val}).AsInt64(); err != nil || n != 1 {
				b.Fatal(n, err, ms)
			}
		}
	})
	// The driver's own scripts (token minting, publish) on the raw client:
	// the floor for this driver's adapter code.
	b.Run("floor=raw-rueidis-same-scripts", func(b *testing.B) {
		cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		defer cl.Close()
		acq, rel := rueidis.NewLuaScript(rediscore.AcquireScript.Src), rueidis.NewLuaScript(rediscore.ReleaseScript.Src)
		lock, counter, ch := rediscore.Keys("", "same")
		owner, ms := "owner-0123456789abcdef0123456789abcdef", strconv.FormatInt(ttl.Milliseconds(), 10)
		ret := strconv.FormatInt(rediscore.DefaultTokenRetention.Milliseconds(), 10)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := acq.Exec(ctx, cl, []string{lock, counter}, []string{owner, ms, ret}).Error(); err != nil {
				b.Fatal(err)
			}
			if n, err := rel.Exec(ctx, cl, releaseKeys(lock), []string{owner, ch, rediscore.WakeChannel("", "")}).AsInt64(); err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	})
	b.Run("driver", func(b *testing.B) {
		d := openT(b, urlOf(s.Addr))
		owner := "owner-0123456789abcdef0123456789abcdef"
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := d.Acquire(ctx, "k", owner, ttl); err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, "k", owner); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("locker.TryAcquire+Release", func(b *testing.B) {
		l := locker.New(openT(b, urlOf(s.Addr)))
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			lk, err := l.TryAcquire(ctx, "lk", locker.WithTTL(ttl), locker.WithAutoRenew(false))
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("rueidislock.TryWithContext+cancel", func(b *testing.B) {
		rl, err := rueidislock.NewLocker(rueidislock.LockerOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true},
			KeyMajority:  1, NoLoopTracking: true, KeyValidity: ttl,
		})
		if err != nil {
			b.Fatal(err)
		}
		defer rl.Close()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			_, cancel, err := rl.TryWithContext(ctx, "rk")
			if err != nil {
				b.Fatal(err)
			}
			cancel()
		}
	})
}

// BenchmarkUncontendedInterleaved alternates the floor (raw SET NX PX +
// release script), the raw client running the driver's own scripts, and
// the driver, op by op, so that load changes on a shared host hit all three
// alike; it reports each one's mean time per acquire+release and the ratios.
// (ns/op is the sum of the three.)
func BenchmarkUncontendedInterleaved(b *testing.B) {
	s := benchServer(b)
	ctx := context.Background()
	const ttl = 10 * time.Second
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	d := openT(b, urlOf(s.Addr))
	acq, rel := rueidis.NewLuaScript(rediscore.AcquireScript.Src), rueidis.NewLuaScript(rediscore.ReleaseScript.Src)
	lock, counter, ch := rediscore.Keys("", "same")
	owner, ms := "owner-0123456789abcdef0123456789abcdef", strconv.FormatInt(ttl.Milliseconds(), 10)
	ret := strconv.FormatInt(rediscore.DefaultTokenRetention.Milliseconds(), 10)
	var floor, same, drv time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := cl.Do(ctx, cl.B().Set().Key("raw:{k}").Value(owner).Nx().PxMilliseconds(ttl.Milliseconds()).Build()).Error(); err != nil {
			b.Fatal(err)
		}
		if n, err := rawRelease.Exec(ctx, cl, []string{"raw:{k}"}, []string{owner}).AsInt64(); err != nil || n != 1 {
			b.Fatal(n, err)
		}
		t1 := time.Now()
		if err := acq.Exec(ctx, cl, []string{lock, counter}, []string{owner, ms, ret}).Error(); err != nil {
			b.Fatal(err)
		}
		if n, err := rel.Exec(ctx, cl, releaseKeys(lock), []string{owner, ch, rediscore.WakeChannel("", "")}).AsInt64(); err != nil || n != 1 {
			b.Fatal(n, err)
		}
		t2 := time.Now()
		if _, err := d.Acquire(ctx, "k", owner, ttl); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, "k", owner); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		floor, same, drv = floor+t1.Sub(t0), same+t2.Sub(t1), drv+t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(floor.Nanoseconds())/n, "floor-ns/op")
	b.ReportMetric(float64(same.Nanoseconds())/n, "same-scripts-ns/op")
	b.ReportMetric(float64(drv.Nanoseconds())/n, "driver-ns/op")
	b.ReportMetric(float64(drv)/float64(floor), "driver/floor")
	b.ReportMetric(float64(drv)/float64(same), "driver/same-scripts")
}

// commandCalls sums calls= over INFO commandstats, minus the INFO calls.
func commandCalls(b *testing.B, s *redistest.Server) (total int, per map[string]int) {
	b.Helper()
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		b.Fatal(err)
	}
	per = map[string]int{}
	for _, line := range strings.Split(v.(string), "\r\n") {
		name, rest, ok := strings.Cut(line, ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
		per[strings.TrimPrefix(name, "cmdstat_")] = n
		total += n
	}
	return total, per
}

// rtt measures the median PING round trip of a rueidis client.
func rtt(b *testing.B, addr string) time.Duration {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	ds := make([]time.Duration, 201)
	for i := range ds {
		t0 := time.Now()
		if err := cl.Do(ctx, cl.B().Ping().Build()).Error(); err != nil {
			b.Fatal(err)
		}
		ds[i] = time.Since(t0)
	}
	for i := 1; i < len(ds); i++ {
		for j := i; j > 0 && ds[j] < ds[j-1]; j-- {
			ds[j], ds[j-1] = ds[j-1], ds[j]
		}
	}
	return ds[len(ds)/2]
}

// acquirer takes the contended key and returns its release.
type acquirer func(ctx context.Context) (release func(), err error)

// handoff runs waiters goroutines, each with its own acquirer (its own
// "process"), contending for one key; each holds it for hold. One op is one
// grant. It reports the mean time from the start of a release to the next
// grant (handoff-µs, and in PING round trips), and the server commands
// per grant (INFO commandstats).
func handoff(b *testing.B, s *redistest.Server, acq []acquirer, hold time.Duration) {
	r := rtt(b, s.Addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu          sync.Mutex
		lastRelease time.Time
		gaps        time.Duration
		ngaps       int
		grants      atomic.Int64
		wg          sync.WaitGroup
	)
	total := int64(b.N)
	cmds0, perBefore := commandCalls(b, s)
	b.ReportAllocs()
	b.ResetTimer()
	for _, a := range acq {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				release, err := a(ctx)
				if err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				now := time.Now()
				mu.Lock()
				if !lastRelease.IsZero() {
					gaps += now.Sub(lastRelease)
					ngaps++
				}
				mu.Unlock()
				n := grants.Add(1)
				time.Sleep(hold) // the critical section
				mu.Lock()
				lastRelease = time.Now()
				mu.Unlock()
				release()
				if n >= total {
					cancel()
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cmds1, per := commandCalls(b, s)
	grantsN := grants.Load()
	if ngaps > 0 {
		mean := gaps / time.Duration(ngaps)
		b.ReportMetric(float64(mean.Microseconds()), "handoff-µs")
		b.ReportMetric(float64(mean)/float64(r), "handoff-RTTs")
	}
	b.ReportMetric(float64(r.Microseconds()), "rtt-µs")
	b.ReportMetric(float64(cmds1-cmds0)/float64(grantsN), "cmds/grant")
	b.ReportMetric(float64(per["evalsha"]+per["eval"]-perBefore["evalsha"]-perBefore["eval"])/float64(grantsN), "scripts/grant")
	b.ReportMetric(float64(per["echo"]-perBefore["echo"])/float64(grantsN), "arms/grant")
	if testing.Verbose() {
		b.Logf("N=%d grants=%d commands per grant by type: %v", b.N, grantsN, per)
	}
}

// tokenAcquirers share an in-process token (a buffered channel) that the
// releaser hands over after the raw release script: the handoff floor, one
// goroutine wake-up plus the raw SET NX PX, with no server notification.
func tokenAcquirers(b *testing.B, s *redistest.Server, n int, ttl time.Duration) []acquirer {
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cl.Close)
	token := make(chan struct{}, 1)
	token <- struct{}{}
	acq := make([]acquirer, n)
	for i := range acq {
		val := "owner-" + strconv.Itoa(i)
		acq[i] = func(ctx context.Context) (func(), error) {
			select {
			case <-token:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if err := cl.Do(ctx, cl.B().Set().Key("raw:{hot}").Value(val).Nx().PxMilliseconds(ttl.Milliseconds()).Build()).Error(); err != nil {
				return nil, err
			}
			return func() {
				_ = rawRelease.Exec(context.Background(), cl, []string{"raw:{hot}"}, []string{val}).Error()
				token <- struct{}{}
			}, nil
		}
	}
	return acq
}

// BenchmarkContention: 8 waiters (each its own Locker, as 8 processes
// would be), 5ms hold.
func BenchmarkContention(b *testing.B) {
	const waiters, hold, ttl = 8, 5 * time.Millisecond, 10 * time.Second
	b.Run("floor=in-process-token+raw-SETNX", func(b *testing.B) {
		s := benchServer(b)
		handoff(b, s, tokenAcquirers(b, s, waiters, ttl), hold)
	})
	b.Run("driver-via-locker", func(b *testing.B) {
		s := benchServer(b)
		acq := make([]acquirer, waiters)
		for i := range acq {
			l := locker.New(openT(b, urlOf(s.Addr)))
			acq[i] = func(ctx context.Context) (func(), error) {
				lk, err := l.Acquire(ctx, "hot", locker.WithTTL(ttl), locker.WithAutoRenew(false))
				if err != nil {
					return nil, err
				}
				return func() { _ = lk.Release(context.Background()) }, nil
			}
		}
		handoff(b, s, acq, hold)
	})
	b.Run("driver-one-locker-8-goroutines", func(b *testing.B) {
		s := benchServer(b)
		l := locker.New(openT(b, urlOf(s.Addr)))
		acq := make([]acquirer, waiters)
		for i := range acq {
			acq[i] = func(ctx context.Context) (func(), error) {
				lk, err := l.Acquire(ctx, "hot", locker.WithTTL(ttl), locker.WithAutoRenew(false))
				if err != nil {
					return nil, err
				}
				return func() { _ = lk.Release(context.Background()) }, nil
			}
		}
		handoff(b, s, acq, hold)
	})
	b.Run("rueidislock", func(b *testing.B) {
		s := benchServer(b)
		acq := make([]acquirer, waiters)
		for i := range acq {
			rl, err := rueidislock.NewLocker(rueidislock.LockerOption{
				ClientOption: rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true},
				KeyMajority:  1, NoLoopTracking: true, KeyValidity: ttl,
			})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(rl.Close)
			acq[i] = func(ctx context.Context) (func(), error) {
				_, cancel, err := rl.WithContext(ctx, "hot")
				if err != nil {
					if errors.Is(err, context.Canceled) {
						return nil, ctx.Err()
					}
					return nil, err
				}
				return cancel, nil
			}
		}
		handoff(b, s, acq, hold)
	})
}

// BenchmarkQueue: separate Lockers (as separate processes) contending
// for one key, 5ms hold, with the fair queue (the default) and barging
// (fair=false); see drivertest.Contention for the metrics. Run with a fixed
// count, e.g. -benchtime 400x.
func BenchmarkQueue(b *testing.B) {
	s := redistest.Start(b)
	for _, mode := range []string{"fair", "barging"} {
		for _, procs := range []int{8, 32, 64} {
			b.Run(mode+"-"+strconv.Itoa(procs), func(b *testing.B) {
				dsn := urlOf(s.Addr)
				if mode == "barging" {
					dsn += "?fair=false"
				}
				drivertest.Contention(b, s, dsn, procs, 5*time.Millisecond)
			})
		}
	}
}

// releaseKeys returns ReleaseScript's keys: the lock and its (empty) queue.
func releaseKeys(lock string) []string {
	ql, qz := rediscore.QueueKeys(lock)
	return []string{lock, ql, qz}
}
