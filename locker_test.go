package locker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

func contextCancelled() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx, cancel
}

type nopDriver struct{}

var registerNop sync.Once

func (nopDriver) Open(string) (driver.Locker, error) { return nil, errors.New("nop") }

func TestRegister(t *testing.T) {
	for name, fn := range map[string]func(){
		"nil driver":     func() { locker.Register("x-nil", nil) },
		"empty name":     func() { locker.Register("", nopDriver{}) },
		"duplicate name": func() { locker.Register("mem", nopDriver{}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register with %s did not panic", name)
				}
			}()
			fn()
		}()
	}
	registerNop.Do(func() { locker.Register("zz-test-nop", nopDriver{}) })
	names := locker.Drivers()
	if !slices.IsSorted(names) || !slices.Contains(names, "mem") || !slices.Contains(names, "zz-test-nop") {
		t.Fatalf("Drivers() = %v", names)
	}
	if _, err := locker.Open("zz-test-nop", ""); err == nil || err.Error() != "locker: open: nop" {
		t.Fatalf("Open of a failing driver: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	_, err := locker.Open("nosuch", "")
	if err == nil || !strings.Contains(err.Error(), `unknown driver "nosuch" (forgotten import?)`) {
		t.Fatalf("Open(nosuch): %v", err)
	}
	_, err = locker.OpenURL("nosuch://h")
	if err == nil || !strings.Contains(err.Error(), "registered: ") || !strings.Contains(err.Error(), "mem") {
		t.Fatalf("OpenURL(nosuch://): %v", err)
	}
	for _, bad := range []string{"://x", "no-scheme", "redis://:pass word@h:bad/"} {
		_, err := locker.OpenURL(bad)
		if !errors.Is(err, locker.ErrInvalid) {
			t.Errorf("OpenURL(%q) = %v, want ErrInvalid", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "pass") {
			t.Errorf("OpenURL error leaks the URL's password: %v", err)
		}
	}
	_, err = locker.OpenURL("mem://x?bogus=1")
	if !errors.Is(err, locker.ErrInvalid) || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("unknown query parameter: %v", err)
	}
}

// Errors carry the "locker:" prefix exactly once and keep errors.Is.
func TestErrorsWrappedOnce(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	cancelled, cancel := contextCancelled()
	defer cancel()
	for name, err := range map[string]error{
		"not acquired": func() error { _, err := l.TryAcquire(ctx, "k"); return err }(),
		"empty key":    func() error { _, err := l.TryAcquire(ctx, ""); return err }(),
		"bad ttl":      func() error { _, err := l.TryAcquire(ctx, "k2", locker.WithTTL(-1)); return err }(),
		"cancelled":    func() error { _, err := l.Acquire(cancelled, "k3"); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		if n := strings.Count(err.Error(), "locker:"); n != 1 {
			t.Errorf("%s: %q has %d \"locker:\" prefixes", name, err, n)
		}
	}
	_, err = l.Acquire(cancelled, "k3")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire with a cancelled context: %v", err)
	}
	_, err = l.TryAcquire(ctx, "k")
	if !errors.Is(err, locker.ErrNotAcquired) || !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("errors.Is across layers: %v", err)
	}
}

// A lost reply (the grant happened, the caller saw an error) leaves nothing
// held: the Locker releases the owner it generated.
// Many waiters of one key in one Locker: one subscription, and a number of
// driver attempts per handoff that does not grow with the number of
// waiters.
// The blocking path: the Locker hands the wait to the driver, and Close
// cuts it short with ErrClosed.
// Without a Waiter, a crashed holder (its lock left to expire) is taken over
// at its TTL plus a few milliseconds, thanks to the HeldError's remaining
// TTL, not at the next backoff step.
func TestInspect(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v", err)
	}
	lk, err := l.TryAcquire(ctx, "k", locker.WithOwner("worker-1"))
	if err != nil {
		t.Fatal(err)
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil || in.Owner != "worker-1" || in.Token != lk.Token() {
		t.Fatalf("Inspect = %+v, %v", in, err)
	}
	type bare struct{ driver.Locker }
	l2 := locker.New(bare{mem.NewStore().Locker()})
	defer l2.Close()
	if _, err := l2.Inspect(ctx, "k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Inspect without an Inspector: %v", err)
	}
}

func TestDoReturnsErrorsAndReleases(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	want := fmt.Errorf("job failed")
	if err := l.Do(ctx, "k", func(context.Context) error { return want }); !errors.Is(err, want) {
		t.Fatalf("Do: %v", err)
	}
	ran := false
	if err := l.Do(ctx, "k", func(context.Context) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("Do after an error: %v, ran %v", err, ran)
	}
}

func TestClosedLocker(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ctx := ctxT(t, 10*time.Second)
	for name, err := range map[string]error{
		"TryAcquire": func() error { _, err := l.TryAcquire(ctx, "k"); return err }(),
		"Acquire":    func() error { _, err := l.Acquire(ctx, "k"); return err }(),
		"Do":         l.Do(ctx, "k", func(context.Context) error { return nil }),
		"Inspect":    func() error { _, err := l.Inspect(ctx, "k"); return err }(),
		"Ping":       l.Ping(ctx),
	} {
		if !errors.Is(err, locker.ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
}

// While waiting, a transient error does not end the wait; attempts whose
// reply was lost are cleaned up, and that clean-up cannot free the grant that
// a later attempt wins.
// A waiting Acquire whose context ends after transient errors says so.
// After a server-side wait longer than a quarter of the TTL, the lock's safe
// deadline is counted from a fresh refresh, not from the start of the wait.
