// Package redisbench compares drivers/redis with the Redis lock libraries
// people use today, against one redis-server started by the benchmark, in
// the same run: an uncontended acquire+release.
//
//	cd bench/redis && go test -run '^$' -bench . -benchmem
package redisbench

import (
	"context"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	goredislib "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	lockredis "github.com/go-locker/locker/drivers/redis"
	"github.com/go-locker/locker/internal/redistest"
)

var release = goredislib.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)

func BenchmarkAcquireRelease(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	client := goredislib.NewClient(&goredislib.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
	defer client.Close()

	b.Run("raw-go-redis", func(b *testing.B) {
		if err := release.Load(ctx, client).Err(); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if ok, err := client.SetNX(ctx, "raw", "owner", 30*time.Second).Result(); err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := release.EvalSha(ctx, client, []string{"raw"}, "owner").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("locker-driver", func(b *testing.B) {
		l, err := lockredis.New(ctx, client, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Acquire(ctx, "drv", "owner", 30*time.Second); err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, "drv", "owner"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("locker", func(b *testing.B) {
		d, err := lockredis.New(ctx, client, nil)
		if err != nil {
			b.Fatal(err)
		}
		l := locker.New(d)
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "lk", locker.WithTTL(30*time.Second), locker.WithAutoRenew(false))
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bsm-redislock", func(b *testing.B) {
		lc := redislock.New(client)
		b.ReportAllocs()
		for b.Loop() {
			lk, err := lc.Obtain(ctx, "bsm", 30*time.Second, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-redsync", func(b *testing.B) {
		rs := redsync.New(goredis.NewPool(client))
		b.ReportAllocs()
		for b.Loop() {
			m := rs.NewMutex("redsync", redsync.WithExpiry(30*time.Second), redsync.WithTries(1))
			if err := m.LockContext(ctx); err != nil {
				b.Fatal(err)
			}
			if _, err := m.UnlockContext(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkInterleaved runs one acquire+release of every implementation per
// op, in turn, so that a loaded machine slows them all alike, and reports
// each one's mean (…-ns) and its ratio to the raw floor (…/raw).
func BenchmarkInterleaved(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	client := goredislib.NewClient(&goredislib.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
	defer client.Close()
	if err := release.Load(ctx, client).Err(); err != nil {
		b.Fatal(err)
	}
	drv, err := lockredis.New(ctx, client, nil)
	if err != nil {
		b.Fatal(err)
	}
	l := locker.New(drv)
	lc := redislock.New(client)
	rs := redsync.New(goredis.NewPool(client))
	impls := []struct {
		name string
		f    func() error
	}{
		{"raw", func() error {
			if err := client.SetNX(ctx, "raw", "owner", 30*time.Second).Err(); err != nil {
				return err
			}
			return release.EvalSha(ctx, client, []string{"raw"}, "owner").Err()
		}},
		{"driver", func() error {
			if _, err := drv.Acquire(ctx, "drv", "owner", 30*time.Second); err != nil {
				return err
			}
			return drv.Release(ctx, "drv", "owner")
		}},
		{"locker", func() error {
			lk, err := l.TryAcquire(ctx, "lk", locker.WithTTL(30*time.Second), locker.WithAutoRenew(false))
			if err != nil {
				return err
			}
			return lk.Release(ctx)
		}},
		{"bsm", func() error {
			lk, err := lc.Obtain(ctx, "bsm", 30*time.Second, nil)
			if err != nil {
				return err
			}
			return lk.Release(ctx)
		}},
		{"redsync", func() error {
			m := rs.NewMutex("redsync", redsync.WithExpiry(30*time.Second), redsync.WithTries(1))
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			_, err := m.UnlockContext(ctx)
			return err
		}},
	}
	sums := make([]time.Duration, len(impls))
	b.ReportAllocs()
	for b.Loop() {
		for i, im := range impls {
			t0 := time.Now()
			if err := im.f(); err != nil {
				b.Fatal(im.name, err)
			}
			sums[i] += time.Since(t0)
		}
	}
	for i, im := range impls {
		b.ReportMetric(float64(sums[i].Nanoseconds())/float64(b.N), im.name+"-ns")
		if i > 0 {
			b.ReportMetric(float64(sums[i])/float64(sums[0]), im.name+"/raw")
		}
	}
}
