package drivertest

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
)

// FairFreed runs, on d (whose URL should set a queue_ttl of several
// seconds, so that neither a heartbeat nor a lapsed entry can pass for a
// wake-up), every way a held key becomes free with a waiter queued for it;
// each time the waiter must be granted within HandoffBound of the key
// becoming free:
//
//   - release: the holder releases;
//   - min-hold: the holder releases under WithMinHold, and the key expires
//     at the bound;
//   - shorter-refresh: the holder, another process, refreshes to a shorter
//     TTL and then crashes;
//   - expiry: the holder, another process, crashes;
//   - waiter-cancelled: the waiter first in line is cancelled, then the
//     holder releases;
//   - waiter-closed: the Locker of the waiter first in line is closed: its
//     queue entry is gone when Close returns (checked on the server), then
//     the holder releases.
func FairFreed(t *testing.T, d Deployment) {
	const hold = 400 * time.Millisecond
	type holder struct {
		lk    *locker.Lock
		start time.Time // before the grant
	}
	take := func(t *testing.T, key string, opts ...locker.Option) holder {
		t.Helper()
		start := time.Now()
		lk, err := Open(t, d.URL).TryAcquire(context.Background(), key, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return holder{lk, start}
	}
	// queue queues a waiter on a Locker of its own and returns its outcome.
	queue := func(t *testing.T, key string, n int64) <-chan acquired {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t.Cleanup(cancel)
		c := acquireAsync(ctx, Open(t, d.URL), key, 10*time.Second)
		waitFor(t, 10*time.Second, "the waiter in the queue", func() bool { return d.queueLen(t, key) == n })
		return c
	}
	release := func(t *testing.T, h holder) time.Time {
		t.Helper()
		at := time.Now()
		if err := h.lk.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		return at
	}
	done := func(t *testing.T, key string, lk *locker.Lock) {
		t.Helper()
		if err := lk.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
	}
	t.Run("release", func(t *testing.T) {
		key := "freed-release"
		h := take(t, key, locker.WithTTL(10*time.Second))
		w := queue(t, key, 1)
		done(t, key, grantedWithinOf(t, w, release(t, h), "the waiter"))
	})
	t.Run("min-hold", func(t *testing.T) {
		key := "freed-min-hold"
		h := take(t, key, locker.WithTTL(10*time.Second), locker.WithMinHold(hold))
		w := queue(t, key, 1)
		release(t, h)
		done(t, key, grantedWithinOf(t, w, h.start.Add(hold), "the waiter, after the min-hold bound"))
	})
	// crashed starts a child process holding key with ttl (no renewal),
	// from a moment after the returned time.
	crashed := func(t *testing.T, key string, ttl time.Duration) (*child, time.Time) {
		t.Helper()
		c := startChild(t, childURLEnv+"="+d.URL, childKeyEnv+"="+strconv.Quote(key), childTTLEnv+"="+ttl.String(), childModeEnv+"=hold")
		c.expect("ready")
		start := time.Now()
		c.say("go")
		c.expect("held")
		return c, start
	}
	t.Run("shorter-refresh", func(t *testing.T) {
		key := "freed-shorter-refresh"
		c, _ := crashed(t, key, 10*time.Second)
		w := queue(t, key, 1)
		at := time.Now()
		c.say("refresh " + hold.String())
		c.expect("refreshed <nil>")
		c.kill()
		// The holder crashed: it never releases.
		done(t, key, grantedWithinOf(t, w, at.Add(hold), "the waiter, after the shortened TTL"))
	})
	t.Run("expiry", func(t *testing.T) {
		key := "freed-expiry"
		const ttl = time.Second
		c, start := crashed(t, key, ttl)
		w := queue(t, key, 1)
		c.kill()
		done(t, key, grantedWithinOf(t, w, start.Add(ttl), "the waiter, after the expiry"))
	})
	t.Run("waiter-cancelled", func(t *testing.T) {
		key := "freed-waiter-cancelled"
		h := take(t, key, locker.WithTTL(10*time.Second))
		ctx, cancel := context.WithCancel(context.Background())
		gone := acquireAsync(ctx, Open(t, d.URL), key, 10*time.Second)
		waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
		w := queue(t, key, 2)
		cancel()
		if r := <-gone; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("cancelled Acquire = %v, want context.Canceled", r.err)
		}
		waitFor(t, 5*time.Second, "the cancelled waiter out of the queue", func() bool { return d.queueLen(t, key) == 1 })
		done(t, key, grantedWithinOf(t, w, release(t, h), "the waiter behind a cancelled one"))
	})
	t.Run("waiter-closed", func(t *testing.T) { FairClosedWaiter(t, d) })
}

// FairClosedWaiter: the Locker of the waiter first in line is closed while
// it waits. Its Acquire returns ErrClosed, and when Close returns its
// queue entry is gone from the server (only the live waiter behind it is
// left); the holder's release then grants that waiter within
// HandoffBound. Five rounds: Close races the waiter's own look at the
// queue.
func FairClosedWaiter(t *testing.T, d Deployment) {
	key := "freed-waiter-closed"
	for round := range 5 {
		lk, err := Open(t, d.URL).TryAcquire(context.Background(), key, locker.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		closing, err := locker.OpenURL(d.URL)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		gone := acquireAsync(ctx, closing, key, 10*time.Second)
		waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
		w := acquireAsync(ctx, Open(t, d.URL), key, 10*time.Second)
		waitFor(t, 10*time.Second, "the second waiter in the queue", func() bool { return d.queueLen(t, key) == 2 })
		if err := closing.Close(); err != nil {
			t.Fatal(err)
		}
		if n := d.queueLen(t, key); n != 1 {
			t.Fatalf("round %d: %d queue entries once the first waiter's Locker closed; want 1 (the live waiter's)", round, n)
		}
		if r := <-gone; !errors.Is(r.err, locker.ErrClosed) {
			t.Fatalf("round %d: the closed Locker's Acquire = %v, want ErrClosed", round, r.err)
		}
		released := time.Now()
		if err := lk.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		g := grantedWithinOf(t, w, released, "the waiter behind a closed one")
		if err := g.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		cancel()
		waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
	}
}

// OddKeysModes runs OddKeys on one server and on a Cluster of three
// masters, with queue_ttl=5s, on the driver whose URLs u spells.
func OddKeysModes(t *testing.T, u URLs) { singleAndCluster(t, u, OddKeys) }

// FairFreedModes runs FairFreed on one server and on a Cluster of three
// masters, with queue_ttl=5s, on the driver whose URLs u spells.
func FairFreedModes(t *testing.T, u URLs) { singleAndCluster(t, u, FairFreed) }

func singleAndCluster(t *testing.T, u URLs, f func(*testing.T, Deployment)) {
	q := "queue_ttl=5s"
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		f(t, Deployment{URL: With(u.Of(s.Addr), q), Servers: []*redistest.Server{s}})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		f(t, Deployment{URL: With(u.Of(c.Addrs()...), "cluster=true", q), Servers: c.Masters})
	})
}
