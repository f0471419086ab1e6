package etcd

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// TestWatchChanges: a Locker watching a key's changes hears each grant and
// release made through another Locker, and the expiry of a lease that was
// not renewed; changes of other keys are not reported; after Close
// WatchChanges fails with ErrClosed.
func TestWatchChanges(t *testing.T) {
	w := openTest(t, "")
	d, err := Driver{}.Open(testURL(t) + w.Prefix())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	h := d.(*Locker)
	ctx := testCtx(t)
	ch := make(chan struct{}, 1)
	stop, err := w.WatchChanges(ctx, "k", func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if _, err := h.Acquire(ctx, "k", "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	mustWake(t, ch, "grant")
	if err := h.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	mustWake(t, ch, "release")
	if _, err := h.Acquire(ctx, "other", "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Acquire(ctx, "k", "b", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	mustWake(t, ch, "grant after a release")
	// The lease is never renewed: etcd deletes the key when it expires.
	mustWake(t, ch, "expiry")
	if _, err := h.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("after the expiry report: Inspect %v, want ErrNotHeld", err)
	}
	_ = h.Release(ctx, "other", "a")
	_ = w.Close()
	if _, err := w.WatchChanges(ctx, "k", func() {}); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}
