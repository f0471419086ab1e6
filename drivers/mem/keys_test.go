package mem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// FuzzKeyOwner fuzzes the key and the owner through a grant, Inspect, the
// wake-up of a release (a subscriber of the key is woken, one of a key one
// byte longer is not) and a waiting Acquire's handoff (granted within 1s
// of the release). A key or an owner package locker refuses must fail with
// ErrInvalid. (mem has no hold watch: a lock there is lost only by expiry
// or a takeover, which renewals report.) The seeds are the keys, owners
// and prefixes of the Redis key tests: spaces, colons, newlines, braces,
// non-UTF-8 bytes.
func FuzzKeyOwner(f *testing.F) {
	for _, s := range [][2]string{
		{"tenant 42/report", "worker 7"}, {"a:b:c", "own:er:1"}, {"line\nbreak", "own\ner"},
		{"{tag} x", "{o} 1"}, {"{5}x 7", "{5}"}, {"\xff\xfe k\x00", "\xc3\x28 o"},
		{"", "empty key"}, {"empty owner", ""},
	} {
		f.Add(s[0], s[1])
	}
	store := mem.NewStore()
	holder, waiter := locker.New(store.Locker()), locker.New(store.Locker())
	watcher := store.Locker().(driver.Waiter)
	f.Fuzz(func(t *testing.T, key, owner string) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		lk, err := holder.TryAcquire(ctx, key, locker.WithOwner(owner), locker.WithTTL(time.Minute))
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
		wake, stop, err := watcher.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		otherWake, otherStop, err := watcher.Subscribe(ctx, key+" ")
		if err != nil {
			t.Fatal(err)
		}
		defer otherStop()
		other := "waiter"
		if other == owner {
			other = "waiter 2"
		}
		type res struct {
			lk  *locker.Lock
			at  time.Time
			err error
		}
		w := make(chan res, 1)
		go func() {
			lk, err := waiter.Acquire(ctx, key, locker.WithOwner(other), locker.WithTTL(time.Minute))
			w <- res{lk, time.Now(), err}
		}()
		released := time.Now()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wake:
		case <-time.After(time.Second):
			t.Fatal("the key's subscriber was not woken within 1s of the release")
		}
		select {
		case <-otherWake:
			t.Fatalf("the release of %q woke a subscriber of %q", key, key+" ")
		default:
		}
		r := <-w
		if r.err != nil || r.at.Sub(released) > time.Second {
			t.Fatalf("the waiter: %v, %v after the release; want a grant within 1s", r.err, r.at.Sub(released))
		}
		if info, err := waiter.Inspect(ctx, key); err != nil || info.Owner != other || info.Token != r.lk.Token() {
			t.Fatalf("Inspect = %+v, %v; want owner %q, token %d", info, err, other, r.lk.Token())
		}
		if err := r.lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
