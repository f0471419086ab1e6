package drivertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
)

// FuzzSeeds adds OddCases' keys and owners to f's seed corpus, which go
// test runs without -fuzz.
func FuzzSeeds(f *testing.F) {
	for _, c := range OddCases {
		f.Add(c.Key, c.Owner)
	}
	f.Add("", "empty key")
	f.Add("empty owner", "")
}

// fuzzBound is how soon the fuzzed handoff and hold watch must act: well
// under the heartbeat (queue_ttl/2 = 5s) and the renewal (TTL/3), so that
// only a wake-up, or an invalidation, can meet it.
const fuzzBound = time.Second

// FuzzKeyOwner fuzzes the key and the owner through a grant, Inspect, a
// queued waiter's handoff and the hold watch, on one server, with the
// driver whose URLs u spells (queue_ttl=10s). A key or an owner package
// locker refuses must fail with ErrInvalid.
func FuzzKeyOwner(f *testing.F, u URLs) {
	FuzzSeeds(f)
	s := redistest.Start(f)
	d := Deployment{URL: With(u.Of(s.Addr), "queue_ttl=10s"), Servers: []*redistest.Server{s}}
	open := func() *locker.Locker {
		l, err := locker.OpenURL(d.URL)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { l.Close() })
		return l
	}
	holder, waiter := open(), open()
	f.Fuzz(func(t *testing.T, key, owner string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lk, err := holder.TryAcquire(ctx, key, locker.WithOwner(owner), locker.WithTTL(10*time.Second))
		if key == "" || len(key) > 4096 || owner == "" || len(owner) > 256 {
			if !errors.Is(err, locker.ErrInvalid) {
				t.Fatalf("TryAcquire(%q, owner %q) = %v, want ErrInvalid", key, owner, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if info, err := holder.Inspect(ctx, key); err != nil || info.Owner != owner || info.Token != lk.Token() {
			t.Fatalf("Inspect = %+v, %v; want owner %q, token %d", info, err, owner, lk.Token())
		}
		other := "waiter"
		if other == owner {
			other = "waiter 2"
		}
		w := acquireAsyncAs(ctx, waiter, key, locker.WithOwner(other), locker.WithTTL(10*time.Second))
		waitFor(t, 10*time.Second, "the waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
		released := time.Now()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var wl *locker.Lock
		select {
		case r := <-w:
			if r.err != nil || r.at.Sub(released) > fuzzBound {
				t.Fatalf("the waiter: %v, %v after the release; want a grant within %v", r.err, r.at.Sub(released), fuzzBound)
			}
			wl = r.lk
		case <-time.After(20 * time.Second):
			t.Fatal("the waiter was never granted")
		}
		if info, err := waiter.Inspect(ctx, key); err != nil || info.Owner != other || info.Token != wl.Token() {
			t.Fatalf("Inspect = %+v, %v; want owner %q, token %d", info, err, other, wl.Token())
		}
		_, lock := d.lockAt(key)
		waitTracked(t, s)
		if _, err := s.Do("DEL", lock); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		select {
		case <-wl.Lost():
			if took := time.Since(deleted); took > fuzzBound || !errors.Is(wl.Err(), locker.CauseServer) {
				t.Fatalf("Lost() after %v with %v; want within %v, cause server", took, wl.Err(), fuzzBound)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Lost() still open 10s after the lock key was deleted")
		}
		waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
	})
}
