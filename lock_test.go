package locker_test

import (
	"errors"
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
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	lostAfter := time.Since(start)
	if lostAfter >= ttl {
		t.Fatalf("Lost closed %v after acquire, not before the TTL %v", lostAfter, ttl)
	}
	if lostAfter < ttl-ttl/100-2*time.Millisecond {
		t.Fatalf("Lost closed %v after acquire, earlier than the deadline", lostAfter)
	}
	if f.refreshes.Load() < 3 {
		t.Fatalf("only %d renewal attempts before the deadline", f.refreshes.Load())
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
