package mem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

func TestConformance(t *testing.T) {
	s := mem.NewStore()
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Locker, error) { return s.Locker(), nil },
	})
}

func TestOpenURL(t *testing.T) {
	a, err := locker.OpenURL("mem://shared-test")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := locker.Open("mem", "mem://shared-test")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := locker.OpenURL("mem://other-test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	lk, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("same store: got %v, want ErrNotAcquired", err)
	}
	lc, err := c.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("other store: %v", err)
	}
	lc.Release(ctx)
}

func TestOpenRejects(t *testing.T) {
	for _, dsn := range []string{
		"mem://x?ttl=1", "mem://x:1", "mem://u@x", "mem://x/path", "redis://x", "mem:opaque", "mem://x#frag", "%zz",
	} {
		_, err := mem.Driver{}.Open(dsn)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", dsn, err)
		}
	}
	for _, dsn := range []string{"", "mem://", "mem://name"} {
		d, err := mem.Driver{}.Open(dsn)
		if err != nil {
			t.Errorf("Open(%q): %v", dsn, err)
			continue
		}
		d.Close()
	}
}

// Expiry wakes subscribers, not only release.
func TestWakeOnExpiry(t *testing.T) {
	s := mem.NewStore()
	a := s.Locker()
	w := s.Locker().(driver.Waiter)
	ctx := context.Background()
	if _, err := a.Acquire(ctx, "k", "o", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wake, cancel, err := w.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	start := time.Now()
	select {
	case <-wake:
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("woken after %v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not woken by expiry")
	}
	if _, err := s.Locker().Acquire(ctx, "k", "p", time.Second); err != nil {
		t.Fatalf("Acquire after expiry: %v", err)
	}
}

// Refresh and Release by an owner that does not hold the key fail with
// ErrNotHeld; when another owner holds it, the error also matches
// ErrNotAcquired and carries that holder's remaining TTL.
func TestNotHeldSaysWhetherTaken(t *testing.T) {
	s := mem.NewStore()
	c := s.Locker()
	ctx := context.Background()
	for name, err := range map[string]error{
		"refresh": c.Refresh(ctx, "k", "me", time.Second),
		"release": c.Release(ctx, "k", "me"),
	} {
		if !errors.Is(err, driver.ErrNotHeld) || errors.Is(err, driver.ErrNotAcquired) {
			t.Errorf("%s of a free key: %v, want ErrNotHeld only", name, err)
		}
	}
	if _, err := c.Acquire(ctx, "k", "other", time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"refresh": c.Refresh(ctx, "k", "me", time.Second),
		"release": c.Release(ctx, "k", "me"),
	} {
		var held *driver.HeldError
		if !errors.Is(err, driver.ErrNotHeld) || !errors.As(err, &held) || held.Remaining <= 0 || held.Remaining > time.Minute {
			t.Errorf("%s of a key another owner holds: %v, want ErrNotHeld and a HeldError", name, err)
		}
	}
	in, err := c.(driver.Inspector).Inspect(ctx, "k")
	if err != nil || in.Owner != "other" || in.Remaining < 59*time.Second {
		t.Fatalf("the holder's lock was changed: %+v, %v", in, err)
	}
}
