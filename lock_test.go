package locker_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// A transient renewal error is retried: the lock survives a burst of
// failures shorter than its TTL.
func TestRenewalRetriesTransientErrors(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := 1500 * time.Millisecond
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	f.setFailRefresh(errTransient)
	// Wait for a few failed renewals, then let them through again, well
	// before the deadline.
	before := f.refreshes.Load()
	deadline := time.Now().Add(10 * time.Second)
	for f.refreshes.Load() < before+2 {
		if time.Now().After(deadline) {
			t.Fatal("no renewal attempts")
		}
		time.Sleep(time.Millisecond)
	}
	f.setFailRefresh(nil)
	// Over three more TTLs the lock stays held.
	end := time.Now().Add(3 * ttl)
	other := st.Locker()
	for time.Now().Before(end) {
		mustOpen(t, lk.Lost(), "lock lost despite renewals recovering")
		if _, err := other.Acquire(ctx, "k", "intruder", ttl); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("intruder: %v", err)
		}
		time.Sleep(ttl / 10)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// When renewals keep failing, Lost closes at the safe deadline, before the
// server lets the key go, and the key is then released at once.
func TestLostAtDeadlineWhenRenewalsFail(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := time.Second
	f.setFailRefresh(errTransient)
	start := time.Now()
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lostOnTime(t, lk, start, ttl)
	if f.refreshes.Load() < 3 {
		t.Fatalf("only %d renewal attempts before the deadline", f.refreshes.Load())
	}
	// An owner-checked release follows the presumed loss, in the
	// background, without the user calling Release.
	for until := time.Now().Add(5 * time.Second); f.releases.Load() == 0; {
		if time.Now().After(until) {
			t.Fatal("no release sent after the presumed loss")
		}
		time.Sleep(time.Millisecond)
	}
	err = lk.Release(ctx)
	if !errors.Is(err, locker.ErrNotHeld) || !strings.Contains(err.Error(), "safe deadline") {
		t.Fatalf("Release after presumed loss: %v", err)
	}
	// The presumed-lost lock was released on the server in the background,
	// before its TTL ran out.
	other := st.Locker()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := other.Acquire(ctx, "k", "next", ttl); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("key never freed")
		}
		time.Sleep(time.Millisecond)
	}
}

// A renewal told ErrNotHeld closes Lost at once.
func TestLostWhenServerSaysNotHeld(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(st.Locker())
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(300*time.Millisecond), locker.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	// Someone with the owner's identity deletes the lock behind its back.
	if err := st.Locker().Release(ctx, "k", "me"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), 5*time.Second, "Lost after the lock was deleted")
	if err := lk.Refresh(ctx, time.Second); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh: %v", err)
	}
}

// Refresh with a new TTL changes the TTL renewal uses, and is rounded up
// like WithTTL.
func TestRefreshChangesTTL(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(capable{st.Locker(), driver.Capabilities{MinTTL: 2 * time.Second, TTLGranularity: time.Second}})
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if lk.TTL() != 2*time.Second {
		t.Fatalf("TTL %v, want it rounded up to the driver's 2s minimum", lk.TTL())
	}
	if err := lk.Refresh(ctx, 2500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if lk.TTL() != 3*time.Second {
		t.Fatalf("TTL after Refresh %v, want 3s (rounded to whole seconds)", lk.TTL())
	}
	in, err := st.Locker().(driver.Inspector).Inspect(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if in.Remaining <= 2*time.Second || in.Remaining > 3*time.Second {
		t.Fatalf("remaining %v on the server, want (2s, 3s]", in.Remaining)
	}
	lk.Release(ctx)
}

// With auto-renewal off the lock lives one TTL, and Refresh extends it.
func TestManualRefresh(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(st.Locker())
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := 2 * time.Second
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(ttl), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		time.Sleep(ttl / 4) // pacing: each Refresh lands well inside the TTL
		if err := lk.Refresh(ctx, ttl); err != nil {
			t.Fatalf("Refresh: %v", err)
		}
	}
	mustOpen(t, lk.Lost(), "lost although refreshed")
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost without refreshes")
}

// Lock.Release after a failed server release can be retried.
func TestReleaseErrorCanBeRetried(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(st.Locker())
	ctx := ctxT(t, 30*time.Second)
	lk, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := contextCancelled()
	defer cancel()
	if err := lk.Release(cancelled); err == nil || errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Release with a cancelled context: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("retried Release: %v", err)
	}
	if err := lk.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("third Release: %v", err)
	}
	l.Close()
}

// A driver that declares a wider drift allowance (Redlock's drift_factor)
// moves the safe deadline earlier: Lost closes at ttl - (ttl×factor + fixed),
// never at the root's default of ttl - (ttl/100 + 2ms).
func TestDriverMarginReachesDeadline(t *testing.T) {
	f := newFaulty(mem.NewStore())
	l := locker.New(capable{f, driver.Capabilities{DriftFactor: 0.2, DriftFixed: 5 * time.Millisecond}})
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := time.Second
	f.setFailRefresh(errTransient)
	start := time.Now()
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if d := lk.Deadline().Sub(start); d < 795*time.Millisecond || d > 895*time.Millisecond {
		t.Fatalf("Deadline is %v after the start of Acquire, want 795ms plus the call's latency", d)
	}
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	lostAfter := time.Since(start)
	want := ttl - ttl/5 - 5*time.Millisecond // 795ms
	if lostAfter < want {
		t.Fatalf("Lost closed %v after acquire, before the deadline %v", lostAfter, want)
	}
	// The default margin would put it at 988ms; allow scheduling slack but
	// stay far below that.
	if lostAfter > want+100*time.Millisecond {
		t.Fatalf("Lost closed %v after acquire: the driver's margin (deadline %v) was not used", lostAfter, want)
	}
	// A driver declaring less than the default cannot narrow the margin.
	if m := (driver.Capabilities{DriftFactor: 0.001}).Margin(ttl); m != ttl/100+2*time.Millisecond {
		t.Fatalf("Margin with a smaller declared drift = %v, want the default %v", m, ttl/100+2*time.Millisecond)
	}
}

// A driver.HoldWatcher that reports the lock gone closes Lost at once, with
// a cause matching ErrNotHeld; the watch is stopped when the lock ends, and
// a report after Release changes nothing.
func TestHoldWatcherClosesLost(t *testing.T) {
	st := mem.NewStore()
	w := &watching{Locker: st.Locker()}
	l := locker.New(w)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)

	lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute), locker.WithOwner("a"))
	if err != nil {
		t.Fatal(err)
	}
	gone := errors.New("session ended")
	fired := time.Now()
	if !w.fire("a", fmt.Errorf("%w: %w", driver.ErrNotHeld, gone)) {
		t.Fatal("Acquire did not start a watch")
	}
	waitClosed(t, lk.Lost(), 5*time.Second, "Lost after the backend reported the loss")
	if d := time.Since(fired); d > 100*time.Millisecond {
		t.Fatalf("Lost closed %v after the report", d)
	}
	if err := lk.Refresh(ctx, time.Minute); !errors.Is(err, locker.ErrNotHeld) || !errors.Is(err, gone) {
		t.Fatalf("Refresh after a reported loss: %v, want ErrNotHeld naming the cause", err)
	}
	if w.stops.Load() != 1 {
		t.Fatalf("watch stopped %d times, want 1", w.stops.Load())
	}

	lk2, err := l.Acquire(ctx, "k2", locker.WithTTL(time.Minute), locker.WithOwner("b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if w.stops.Load() != 2 {
		t.Fatalf("Release stopped the watch %d times in all, want 2", w.stops.Load())
	}
	w.fire("b", driver.ErrNotHeld) // late report after Release: ignored
	mustOpen(t, lk2.Lost(), "a report after Release closed Lost")
}
