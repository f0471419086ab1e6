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
func TestAmbiguousAcquireLeavesNothing(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	f.lostReply = true
	l := locker.New(f)
	ctx := ctxT(t, 10*time.Second)
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, errTransient) {
		t.Fatalf("TryAcquire: %v", err)
	}
	l.Close() // waits for the background clean-up
	if _, err := st.Locker().Acquire(ctx, "k", "other", time.Second); err != nil {
		t.Fatalf("key left held after an ambiguous acquire: %v", err)
	}
}

// Many waiters of one key in one Locker: one subscription, and a number of
// driver attempts per handoff that does not grow with the number of
// waiters.
func TestLocalWaitersShareOneWait(t *testing.T) {
	st := mem.NewStore()
	w := waiting{newFaulty(st)}
	l := locker.New(w)
	defer l.Close()
	holder := locker.New(st.Locker())
	defer holder.Close()
	ctx := ctxT(t, 60*time.Second)
	lk, err := holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 16
	var wg sync.WaitGroup
	var order sync.Mutex
	var tokens []uint64
	started := make(chan struct{}, waiters)
	for range waiters {
		wg.Go(func() {
			started <- struct{}{}
			lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			order.Lock()
			tokens = append(tokens, lk.Token())
			order.Unlock()
			if err := lk.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	for range waiters {
		<-started
	}
	// Wait until every waiter made its first attempt (each makes one
	// before queueing), then release.
	deadline := time.Now().Add(10 * time.Second)
	for w.acquires.Load() < waiters+1 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d attempts", w.acquires.Load())
		}
		time.Sleep(time.Millisecond)
	}
	before := w.acquires.Load()
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !slices.IsSorted(tokens) || len(tokens) != waiters {
		t.Fatalf("tokens %v", tokens)
	}
	perHandoff := float64(w.acquires.Load()-before) / waiters
	t.Logf("%d subscriptions, %.1f driver acquires per handoff", w.subscribes.Load(), perHandoff)
	if perHandoff > 3 {
		t.Fatalf("%.1f driver acquires per handoff with %d local waiters: waiters stampede", perHandoff, waiters)
	}
	if s := w.subscribes.Load(); s > 2 {
		t.Fatalf("%d subscriptions for one key in one Locker", s)
	}
}

// The blocking path: the Locker hands the wait to the driver, and Close
// cuts it short with ErrClosed.
func TestBlockingAcquirer(t *testing.T) {
	st := mem.NewStore()
	b := &blocking{faulty: newFaulty(st)}
	l := locker.New(b)
	holder := locker.New(st.Locker())
	defer holder.Close()
	ctx := ctxT(t, 30*time.Second)
	lk, err := holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctx, "k")
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for b.waits.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("AcquireWait never called")
		}
		time.Sleep(time.Millisecond)
	}
	lk.Release(ctx)
	if err := <-got; err != nil {
		t.Fatalf("Acquire through AcquireWait: %v", err)
	}

	lk, err = holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	go func() {
		_, err := l.Acquire(ctx, "k")
		got <- err
	}()
	for b.waits.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("AcquireWait not called again")
		}
		time.Sleep(time.Millisecond)
	}
	l.Close()
	select {
	case err := <-got:
		if !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("blocked Acquire after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Acquire did not return after Close")
	}
}

// Without a Waiter, a crashed holder (its lock left to expire) is taken over
// at its TTL plus a few milliseconds, thanks to the HeldError's remaining
// TTL, not at the next backoff step.
func TestTakeoverAtHolderTTL(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st) // no Waiter
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := 1200 * time.Millisecond
	start := time.Now()
	if _, err := st.Locker().Acquire(ctx, "k", "crashed", ttl); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	late := time.Since(start) - ttl
	t.Logf("taken over %v after the holder's TTL, %d attempts", late, f.acquires.Load())
	if late < 0 {
		t.Fatalf("taken over before the TTL")
	}
	if n := f.acquires.Load(); n > 12 {
		t.Fatalf("%d attempts while waiting %v for a crashed holder", n, ttl)
	}
}

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
func TestWaitSurvivesTransientErrors(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st) // no Waiter: attempts come from the backoff
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	holder := st.Locker()
	if _, err := holder.Acquire(ctx, "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		lk, err := l.Acquire(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	deadline := time.Now().Add(10 * time.Second)
	for f.acquires.Load() < 2 { // waiting
		if time.Now().After(deadline) {
			t.Fatal("waiter never retried")
		}
		time.Sleep(time.Millisecond)
	}
	f.lostReplies.Store(3) // the next three grants "lose their reply"
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	defer lk.Release(ctx)
	for f.releases.Load() < 3 { // the three clean-ups ran
		if time.Now().After(deadline) {
			t.Fatalf("%d clean-ups", f.releases.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := lk.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("the lock won after transient errors was freed by a clean-up: %v", err)
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil || in.Token != lk.Token() {
		t.Fatalf("Inspect = %+v, %v; want token %d", in, err, lk.Token())
	}
}

// A waiting Acquire whose context ends after transient errors says so.
func TestWaitReportsLastTransientError(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	if _, err := st.Locker().Acquire(context.Background(), "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	f.setFailAcquire(errTransient, 1) // from the second attempt on
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := l.Acquire(ctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errTransient) {
		t.Fatalf("Acquire = %v, want the deadline and the last transient error", err)
	}
}

// After a server-side wait longer than a quarter of the TTL, the lock's safe
// deadline is counted from a fresh refresh, not from the start of the wait.
func TestLongBlockingWaitRefreshes(t *testing.T) {
	st := mem.NewStore()
	b := &blocking{faulty: newFaulty(st)}
	l := locker.New(b)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	holder := st.Locker()
	if _, err := holder.Acquire(ctx, "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	ttl := time.Second
	time.AfterFunc(2*ttl, func() { holder.Release(context.Background(), "k", "holder") })
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	mustOpen(t, lk.Lost(), "a lock granted after a long wait was presumed lost at once")
	if n := b.refreshes.Load(); n != 1 {
		t.Fatalf("%d refreshes after the long wait, want 1", n)
	}
	// It lives its full TTL from then.
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
}
