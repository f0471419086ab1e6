package holdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// Changes: on a single server, a Locker watching a key's changes
// (driver.ChangeWatcher) hears, through its tracking, the first read of
// the key, and then each grant and release made through another Locker,
// and the expiry of a lease that was not renewed.
func Changes(t *testing.T, of func(addrs ...string) string) {
	s := redistest.Start(t)
	w, h := drivertest.Open(t, of(s.Addr)), drivertest.Open(t, of(s.Addr))
	cw, ok := w.Driver().(driver.ChangeWatcher)
	if !ok {
		t.Fatalf("%T is no driver.ChangeWatcher", w.Driver())
	}
	hd := h.Driver()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ch := make(chan struct{}, 1)
	stop, err := cw.WatchChanges(ctx, "k", func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	wake := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change reported within 10s: %s", what)
		}
	}
	wake("the first read")
	if _, err := hd.Acquire(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	wake("grant")
	if err := hd.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	wake("release")
	if _, err := hd.Acquire(ctx, "k", "b", time.Second); err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	wake("grant after a release")
	// A watch may also report a change it cannot rule out (its tracking
	// connection was replaced): each report before the expiry must find
	// the lease still held, and one must come once it has expired.
	for {
		wake("expiry of the 1s lease")
		_, err := hd.Acquire(ctx, "k", "c", time.Minute)
		if err == nil {
			break
		}
		if !errors.Is(err, driver.ErrNotAcquired) || time.Since(granted) > 3*time.Second {
			t.Fatalf("after a change report %v after the 1s grant: %v", time.Since(granted).Round(time.Millisecond), err)
		}
	}
	wake("grant after the expiry")
}
