package locker_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
	"github.com/go-locker/locker/internal/redistest"
)

// lateBy is how late, on this loaded 2-core machine under -race, a timer or
// a woken waiter may be before a test calls it a failure.
const lateBy = 250 * time.Millisecond

// WithMaxHold: at grant + d renewal stops, Lost closes with CauseMaxHold,
// and the key is released, so a waiter gets it within a round trip; never
// before Lost closed.
func TestMaxHold(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	other := locker.New(st.Locker())
	defer other.Close()
	ctx := ctxT(t, 30*time.Second)
	const maxHold = 700 * time.Millisecond
	ttl := 300 * time.Millisecond // renewed twice a TTL: the bound, not the TTL, ends it

	before := time.Now()
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl), locker.WithMaxHold(maxHold))
	if err != nil {
		t.Fatal(err)
	}
	// The waiter reports through got only: it may outlive a failed test.
	type grant struct {
		at    time.Time
		err   error
		early bool // granted before the holder's Lost closed
	}
	got := make(chan grant, 1)
	go func() {
		next, err := other.Acquire(ctx, "k")
		if err != nil {
			got <- grant{err: err}
			return
		}
		g := grant{at: time.Now(), early: true}
		select {
		case <-lk.Lost():
			g.early = false
		default:
		}
		next.Release(ctx)
		got <- g
	}()
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost at the max hold")
	lostAt := time.Since(before)
	if lostAt < maxHold || lostAt > maxHold+lateBy {
		t.Fatalf("Lost closed %v after the start of Acquire, want %v (+%v)", lostAt, maxHold, lateBy)
	}
	if f.refreshes.Load() < 2 {
		t.Fatalf("%d renewals before the max hold", f.refreshes.Load())
	}
	if !errors.Is(lk.Err(), locker.CauseMaxHold) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	g := <-got
	if g.err != nil {
		t.Fatalf("the waiter: %v", g.err)
	}
	if g.early {
		t.Fatal("the waiter was granted the key before the holder's Lost closed")
	}
	grantedAt := g.at.Sub(before)
	if grantedAt < maxHold || grantedAt > maxHold+lateBy {
		t.Fatalf("the waiter was granted %v after the start, want %v (+%v)", grantedAt, maxHold, lateBy)
	}
	refreshes := f.refreshes.Load()
	time.Sleep(ttl) // pacing: a renewal would have run by now
	if n := f.refreshes.Load(); n != refreshes {
		t.Fatalf("%d renewals after the max hold", n-refreshes)
	}
	if err := lk.Refresh(ctx, ttl); !errors.Is(err, locker.CauseMaxHold) || !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Refresh after the max hold: %v", err)
	}
}

// WithMinHold: a Release before grant + d returns nil but leaves the key
// taken, owner-checked, until grant + d, when it expires; a Release after
// the bound frees it at once.
func TestMinHold(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(st.Locker())
	defer l.Close()
	other := locker.New(st.Locker())
	defer other.Close()
	ctx := ctxT(t, 30*time.Second)
	const minHold = 600 * time.Millisecond

	before := time.Now()
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(10*time.Second), locker.WithMinHold(minHold))
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("early Release: %v", err)
	}
	mustOpen(t, lk.Lost(), "Lost closed by a Release")
	if lk.Err() != nil {
		t.Fatalf("Err() = %v after a Release", lk.Err())
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil {
		t.Fatalf("the key is free after an early Release: %v", err)
	}
	if in.Token != lk.Token() || in.Remaining > minHold {
		t.Fatalf("Inspect = %+v: want our grant, expiring within %v", in, minHold)
	}
	if _, err := other.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire during the min hold: %v", err)
	}
	next, err := other.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if granted.Before(before.Add(minHold)) || granted.After(after.Add(minHold+lateBy)) {
		t.Fatalf("granted %v after the start of the first Acquire, want %v (+%v)", granted.Sub(before), minHold, lateBy)
	}
	if err := lk.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("second Release: %v", err)
	}
	next.Release(ctx)

	// After the bound, Release frees the key at once.
	lk, err = l.Acquire(ctx, "k", locker.WithMinHold(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // pacing: past the bound
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("key still held after a Release past the min hold: %v", err)
	}
}

// A min-hold Release is owner-checked: a lock already taken by someone
// else is reported lost (CauseTaken) and the new holder's lock is left
// exactly as it was.
func TestMinHoldOwnerChecked(t *testing.T) {
	st := mem.NewStore()
	l := locker.New(st.Locker())
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	lk, err := l.Acquire(ctx, "k", locker.WithOwner("me"), locker.WithMinHold(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	raw := st.Locker()
	if err := raw.Release(ctx, "k", "me"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Acquire(ctx, "k", "thief", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); !errors.Is(err, locker.CauseTaken) {
		t.Fatalf("Release of a taken lock under a min hold: %v", err)
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil || in.Owner != "thief" || in.Remaining < time.Hour-time.Minute {
		t.Fatalf("the new holder's lock was changed: %+v, %v", in, err)
	}
}

// Close and a presumed loss honour the min hold too: the key stays taken
// until the bound instead of being released.
func TestMinHoldOnCloseAndDeadline(t *testing.T) {
	st := mem.NewStore()
	ctx := ctxT(t, 30*time.Second)
	const minHold = time.Minute
	inspect := func(key string) driver.Info {
		t.Helper()
		in, err := st.Locker().(driver.Inspector).Inspect(ctx, key)
		if err != nil {
			t.Fatalf("%s was freed before its min hold: %v", key, err)
		}
		return in
	}

	l := locker.New(st.Locker())
	lk, err := l.Acquire(ctx, "closed", locker.WithTTL(time.Second), locker.WithMinHold(minHold))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(lk.Err(), locker.CauseClosed) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	if in := inspect("closed"); in.Remaining < minHold-10*time.Second {
		t.Fatalf("after Close: %+v, want it to expire at the min hold", in)
	}

	// Renewals fail; the clean-up after the presumed loss (a refresh with
	// another TTL) goes through.
	f := newFaulty(st)
	ttl := 400 * time.Millisecond
	f.failRefresh, f.failRefreshTTL = errTransient, ttl
	l = locker.New(f)
	defer l.Close()
	lk, err = l.Acquire(ctx, "deadline", locker.WithTTL(ttl), locker.WithMinHold(minHold), locker.WithOwner("o-deadline"))
	if err != nil {
		t.Fatal(err)
	}
	// The server keeps the lock longer than the holder counts on (as it
	// may), so the clean-up cannot race the expiry.
	const serverTTL = 10 * time.Second
	if err := st.Locker().Refresh(ctx, "deadline", "o-deadline", serverTTL); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	if !errors.Is(lk.Err(), locker.CauseDeadline) {
		t.Fatalf("Err() = %v", lk.Err())
	}
	waitFor(t, 10*time.Second, "the clean-up", func() bool { return inspect("deadline").Remaining > serverTTL })
	if in := inspect("deadline"); in.Remaining < minHold-10*time.Second {
		t.Fatalf("after the presumed loss: %+v, want it to expire at the min hold", in)
	}
	if n := f.releases.Load(); n != 0 {
		t.Fatalf("%d releases under a min hold", n)
	}
}

// Bad hold options fail with ErrInvalid before any I/O.
func TestHoldOptionsInvalid(t *testing.T) {
	f := newFaulty(mem.NewStore())
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	for name, opts := range map[string][]locker.Option{
		"negative max hold":      {locker.WithMaxHold(-time.Second)},
		"negative min hold":      {locker.WithMinHold(-1)},
		"min longer than max":    {locker.WithMaxHold(time.Second), locker.WithMinHold(2 * time.Second)},
		"min longer than max, 1": {locker.WithMinHold(time.Second + 1), locker.WithMaxHold(time.Second)},
	} {
		_, err1 := l.TryAcquire(ctx, "k", opts...)
		_, err2 := l.Acquire(ctx, "k", opts...)
		err3 := l.Do(ctx, "k", func(context.Context) error { t.Error("fn ran"); return nil }, opts...)
		for _, err := range []error{err1, err2, err3} {
			if !errors.Is(err, locker.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
	}
	if n := f.acquires.Load(); n != 0 {
		t.Fatalf("%d driver calls for bad options", n)
	}
	for name, opts := range map[string][]locker.Option{
		"min equal to max": {locker.WithMaxHold(time.Second), locker.WithMinHold(time.Second)},
		"min without max":  {locker.WithMinHold(time.Hour)},
		"zeros":            {locker.WithMinHold(0), locker.WithMaxHold(0)},
	} {
		lk, err := l.TryAcquire(ctx, name, opts...)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("%s: Release: %v", name, err)
		}
	}
}

// WithMaxHold counts from the grant on every way of waiting: woken by the
// driver (mem's Waiter; Redis with fair=false), polling (no Waiter), and
// blocked in the server (a BlockingAcquirer; Redis's fair queue). After a
// wait longer than the bound itself, Lost closes no earlier than the bound
// after the holder's release was sent (the earliest the grant can have
// been), and at most the bound after Acquire returned (Granted is between
// the two).
func TestMaxHoldCountsFromGrant(t *testing.T) {
	st := mem.NewStore()
	s := redistest.Start(t)
	type backend struct {
		name string
		open func(t *testing.T) *locker.Locker
	}
	openURL := func(url string) func(t *testing.T) *locker.Locker {
		return func(t *testing.T) *locker.Locker {
			l, err := locker.OpenURL(url)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
	}
	backends := []backend{
		{"mem-waiter", func(*testing.T) *locker.Locker { return locker.New(st.Locker()) }},
		{"mem-polling", func(*testing.T) *locker.Locker { return locker.New(newFaulty(st)) }},
		{"mem-blocking", func(*testing.T) *locker.Locker { return locker.New(&blocking{faulty: newFaulty(st)}) }},
		{"redis", openURL(s.URL())},
		{"redis-fair=false", openURL(s.URL() + "?fair=false")},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			holder, waiter := b.open(t), b.open(t)
			defer holder.Close()
			defer waiter.Close()
			ctx := ctxT(t, 30*time.Second)
			key := fmt.Sprintf("max-hold-from-grant/%s/%d", b.name, time.Now().UnixNano())
			const maxHold, wait = time.Second, 1200 * time.Millisecond
			hl, err := holder.Acquire(ctx, key, locker.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			sent := make(chan time.Time, 1)
			time.AfterFunc(wait, func() {
				sent <- time.Now()
				if err := hl.Release(context.Background()); err != nil {
					t.Errorf("holder's Release: %v", err)
				}
			})
			lk, err := waiter.Acquire(ctx, key, locker.WithTTL(10*time.Second), locker.WithMaxHold(maxHold))
			returned := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			released := <-sent
			if g := lk.Granted(); g.Before(released) || g.After(returned) {
				t.Errorf("Granted() is %v after the holder's release was sent; want between it and Acquire's return (%v)",
					g.Sub(released), returned.Sub(released))
			}
			mustOpen(t, lk.Lost(), "Lost closed as Acquire returned: the max hold counted the wait")
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost at the max hold")
			lost := time.Now()
			if !errors.Is(lk.Err(), locker.CauseMaxHold) {
				t.Fatalf("Err() = %v, want CauseMaxHold", lk.Err())
			}
			if d := lost.Sub(released); d < maxHold {
				t.Fatalf("Lost closed %v after the holder's release was sent, before the max hold %v counted from any possible grant", d, maxHold)
			}
			if d := lost.Sub(returned); d > maxHold+lateBy {
				t.Fatalf("Lost closed %v after Acquire returned, want at most %v (+%v)", d, maxHold, lateBy)
			}
		})
	}
}
