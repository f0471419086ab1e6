package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// lockerSubtests lists the checks of package locker over the driver, the
// CPU-heavy one first.
func (s *suite) lockerSubtests() []subtest {
	return []subtest{
		{name: "Contention", fn: s.lockerContention},
		{name: "TryAcquire", fn: s.lockerTryAcquire},
		{name: "Fencing", fn: s.lockerFencing},
		{name: "BadInput", fn: s.lockerBadInput},
		{name: "TTL", fn: s.lockerTTL},
		{name: "WokenByRelease", fn: s.lockerWokenByRelease, needs: "Waiter|BlockingAcquirer"},
		{name: "LostOnExpiry", fn: s.lockerLostOnExpiry},
		{name: "DoCancelledOnLoss", fn: s.lockerDoCancelledOnLoss},
		{name: "AutoRenew", fn: s.lockerAutoRenew},
		{name: "RefreshAfterLoss", fn: s.lockerRefreshAfterLoss},
		{name: "CancelledWait", fn: s.lockerCancelledWait},
		{name: "Close", fn: s.lockerClose},
		{name: "CloseRaces", fn: s.lockerCloseRaces},
		{name: "MaxHoldFromGrant", fn: s.lockerMaxHoldFromGrant},
	}
}

// The locker layer over the driver: TryAcquire, Release, ErrNotAcquired and
// ErrNotHeld through locker.New.
func (s *suite) lockerTryAcquire(t *testing.T) {
	la, lb := s.locker(t), s.locker(t)
	key := newKey(t)
	ctx := s.callCtx(t)
	lk, err := la.TryAcquire(ctx, key, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("TryAcquire of a free key: %v", err)
	}
	if lk.Key() != key {
		t.Fatalf("Key() = %q, want %q", lk.Key(), key)
	}
	_, err = lb.TryAcquire(ctx, key)
	wantErr(t, "TryAcquire of a held key", err, locker.ErrNotAcquired)
	_, err = la.TryAcquire(ctx, key)
	wantErr(t, "TryAcquire of a key held through the same Locker", err, locker.ErrNotAcquired)
	if err := lk.Refresh(ctx, s.hold()); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantErr(t, "second Release", lk.Release(ctx), locker.ErrNotHeld)
	wantErr(t, "Refresh after Release", lk.Refresh(ctx, s.unit), locker.ErrNotHeld)
	select {
	case <-lk.Lost():
		t.Fatal("Lost closed by a successful Release")
	default:
	}
	lk2, err := lb.TryAcquire(ctx, key)
	if err != nil {
		t.Fatalf("TryAcquire after Release: %v", err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("token %d after release is not greater than %d", lk2.Token(), lk.Token())
	}
	_ = lk2.Release(ctx)
}

// Fencing through the locker layer, across release and expiry.
func (s *suite) lockerFencing(t *testing.T) {
	la, lb := s.locker(t), s.locker(t)
	key := newKey(t)
	ctx := s.callCtx(t)
	var last uint64
	for i := range 4 {
		l := []*locker.Locker{la, lb}[i%2]
		lk, err := l.Acquire(ctx, key, locker.WithTTL(s.unit), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if lk.Token() <= last {
			t.Fatalf("grant %d: token %d not greater than %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if i%2 == 0 {
			// Left to expire: the next Acquire waits for it.
			continue
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

// Bad input is rejected before any I/O with ErrInvalid, and leaves nothing
// held.
func (s *suite) lockerBadInput(t *testing.T) {
	l := s.locker(t)
	ctx := s.callCtx(t)
	key := newKey(t)
	for name, call := range map[string]func() error{
		"TryAcquire with an empty key": func() error { _, err := l.TryAcquire(ctx, ""); return err },
		"Acquire with an empty key":    func() error { _, err := l.Acquire(ctx, ""); return err },
		"Do with an empty key": func() error {
			return l.Do(ctx, "", func(context.Context) error { return nil })
		},
		"TryAcquire with TTL 0":       func() error { _, err := l.TryAcquire(ctx, key, locker.WithTTL(0)); return err },
		"Acquire with a negative TTL": func() error { _, err := l.Acquire(ctx, key, locker.WithTTL(-time.Second)); return err },
		"Acquire with an empty owner": func() error { _, err := l.Acquire(ctx, key, locker.WithOwner("")); return err },
	} {
		wantErr(t, name, call(), locker.ErrInvalid)
	}
	lk, err := l.TryAcquire(ctx, key, locker.WithTTL(s.unit))
	if err != nil {
		t.Fatalf("TryAcquire after rejected calls: %v (something was left held)", err)
	}
	wantErr(t, "Refresh with TTL 0", lk.Refresh(ctx, 0), locker.ErrInvalid)
	_ = lk.Release(ctx)
}

// A waiting Acquire is woken by the holder's release, not by a poll: the
// waiter settles (no attempt starts or ends for a while, at most 4 attempts
// in all) and is then released right away, well before any fallback timer
// of package locker could fire (1.6s at the earliest after its last
// attempt), so only a wake-up caused by the release hands over within
// wakeBound. Run only for drivers with a Waiter or a BlockingAcquirer.
func (s *suite) lockerWokenByRelease(t *testing.T) {
	la := s.locker(t)
	wd, calls := count(s.open(t))
	lb := locker.New(wd)
	t.Cleanup(func() { _ = lb.Close() })
	key := newKey(t)
	ctx := s.callCtx(t)
	lk, err := la.Acquire(ctx, key, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	type res struct {
		lk  *locker.Lock
		err error
		at  time.Time
	}
	got := make(chan res, 1)
	go func() {
		lk, err := lb.Acquire(ctx, key, locker.WithTTL(10*s.unit))
		got <- res{lk, err, time.Now()}
	}()
	const quiet, hold, maxAttempts = 100 * time.Millisecond, 1500 * time.Millisecond, 4
	limit := time.Now().Add(hold)
	for {
		n, last := calls.state()
		if n > maxAttempts {
			t.Fatalf("the waiter made %d acquire attempts while the key was held: it polls", n)
		}
		if n > 0 && time.Since(last) >= quiet {
			break
		}
		if time.Now().After(limit) {
			t.Fatalf("the waiter kept making acquire attempts for %v while the key was held (%d so far): it polls", hold, n)
		}
		select {
		case r := <-got:
			t.Fatalf("Acquire of a held key returned (%v) before the release", r.err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	released := time.Now()
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("waiting Acquire: %v", r.err)
		}
		notBefore(t, "the waiter was granted the key", r.at, released)
		n, _ := calls.state()
		t.Logf("handoff %v after the release, %d attempts", r.at.Sub(released), n)
		_ = r.lk.Release(ctx)
	case <-time.After(wakeBound):
		t.Fatalf("waiter not handed the key within %v of the release: the release did not wake it "+
			"(package locker's fallback timer fires 1.6s after the waiter's last attempt at the earliest)", wakeBound)
	}
}

// With renewal off, the lock's safe deadline is the start of the acquire
// plus the TTL minus the driver's margin; Lost closes at that deadline, not
// before; and no other owner is granted the key before it.
func (s *suite) lockerLostOnExpiry(t *testing.T) {
	la := s.locker(t)
	b := s.open(t)
	key := newKey(t)
	sent := time.Now()
	lk, err := la.TryAcquire(s.callCtx(t), key, locker.WithTTL(max(s.unit, 2*time.Second)), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	g := grant{key: key, token: lk.Token(), sent: sent, returned: time.Now(), ttl: lk.TTL()}
	m := s.margin(g.ttl)
	dl := lk.Deadline()
	if dl.Before(g.sent.Add(g.ttl-m)) || dl.After(g.returned.Add(g.ttl-m)) {
		t.Fatalf("Deadline() is %v after the acquire was sent; want the TTL %v minus the margin %v, from between the call's start and end (%v)",
			dl.Sub(g.sent), g.ttl, m, g.returned.Sub(g.sent))
	}
	lostAt := make(chan time.Time, 1)
	go func() {
		<-lk.Lost()
		lostAt <- time.Now()
	}()
	p := s.expectExpiry(t, b, expiry{g: g, what: "lost on expiry"})[0]
	if p.at.Before(dl) {
		t.Fatalf("another owner was granted the key %v before the holder's safe deadline", dl.Sub(p.at))
	}
	select {
	case at := <-lostAt:
		notBefore(t, "Lost closed", at, dl)
	case <-time.After(wakeBound):
		t.Fatalf("Lost not closed %v after the safe deadline", time.Since(dl))
	}
	wantErr(t, "Release after Lost", lk.Release(s.callCtx(t)), locker.ErrNotHeld)
}

// Package locker rounds a TTL as the driver's capabilities say, and the
// lock lives for the rounded TTL.
func (s *suite) lockerTTL(t *testing.T) {
	l := s.locker(t)
	b := s.open(t)
	for _, req := range []time.Duration{time.Millisecond, s.unit + time.Millisecond} {
		key := newKey(t)
		sent := time.Now()
		lk, err := l.TryAcquire(s.callCtx(t), key, locker.WithTTL(req), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatalf("TryAcquire with TTL %v: %v", req, err)
		}
		g := grant{key: key, sent: sent, returned: time.Now(), ttl: lk.TTL()}
		if want := s.caps.RoundTTL(req); g.ttl != want {
			t.Fatalf("TryAcquire with TTL %v: Lock.TTL() = %v, want %v (the driver's capabilities: %+v)", req, g.ttl, want, s.caps)
		}
		s.expectExpiry(t, b, expiry{g: g, what: "a lock with TTL " + fmtDur(req) + " rounded to " + fmtDur(g.ttl)})
	}
}

// Do's context is cancelled when the lock is lost, Do reports ErrNotHeld,
// and context.Cause says why.
func (s *suite) lockerDoCancelledOnLoss(t *testing.T) {
	l := s.locker(t)
	key := newKey(t)
	ttl := s.unit
	var cause error
	err := l.Do(s.callCtx(t), key, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil
		case <-time.After(ttl + late(ttl) + wakeBound):
			return errors.New("fn's context was not cancelled although the lock expired")
		}
	}, locker.WithTTL(ttl), locker.WithAutoRenew(false))
	wantErr(t, "Do whose lock expired", err, locker.ErrNotHeld)
	wantErr(t, "context.Cause of fn's context", cause, locker.ErrNotHeld)

	// Do runs fn and releases afterwards, also after a panic.
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("Do did not re-panic fn's panic: recovered %v", r)
			}
		}()
		_ = l.Do(s.callCtx(t), key, func(context.Context) error { panic("boom") }, locker.WithTTL(10*s.unit))
	}()
	sentinel := errors.New("fn failed")
	if err := l.Do(s.callCtx(t), key, func(context.Context) error { return sentinel }, locker.WithTTL(10*s.unit)); !errors.Is(err, sentinel) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	lk, err := l.TryAcquire(s.callCtx(t), key, locker.WithTTL(s.unit))
	if err != nil {
		t.Fatalf("TryAcquire after Do: %v (Do did not release)", err)
	}
	_ = lk.Release(s.callCtx(t))
}

// Auto-renewal keeps a lock across several TTLs, and nobody else gets it.
// The TTL is at least 2s: a renewal has 2/3 of it (over 1.3s) to get
// through, so that a process starved of CPU for a moment on a loaded
// machine does not lose the lock for a reason that is not the driver's.
func (s *suite) lockerAutoRenew(t *testing.T) {
	la := s.locker(t)
	b := s.open(t)
	key := newKey(t)
	ttl := max(s.unit, 2*time.Second)
	lk, err := la.Acquire(s.callCtx(t), key, locker.WithTTL(ttl))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	start := time.Now()
	end := start.Add(3*lk.TTL() + lk.TTL()/2)
	// renewed notes when each renewal was first seen (the safe deadline
	// moved), for the failure message: a renewal that came late on a
	// starved machine is not the same bug as a lock lost while renewed.
	var renewed []time.Duration
	last := lk.Deadline()
	seen := func() {
		if d := lk.Deadline(); d.After(last) {
			last = d
			renewed = append(renewed, time.Since(start).Round(time.Millisecond))
		}
	}
	for time.Now().Before(end) {
		s.mustBeHeld(t, b, key, "during auto-renewal")
		seen()
		select {
		case <-lk.Lost():
			t.Fatalf("Lost closed after %v of auto-renewal (renewals seen at %v): %v",
				time.Since(start), renewed, lk.Release(s.callCtx(t)))
		case <-time.After(lk.TTL() / 10):
		}
	}
	seen()
	if err := lk.Release(s.callCtx(t)); err != nil {
		t.Fatalf("Release after %v of auto-renewal (renewals seen at %v, Lost closed: %v): %v",
			time.Since(start), renewed, isClosed(lk.Lost()), err)
	}
}

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Refresh after the lock was lost returns ErrNotHeld, and Lost is closed.
func (s *suite) lockerRefreshAfterLoss(t *testing.T) {
	la := s.locker(t)
	b := s.open(t)
	key := newKey(t)
	sent := time.Now()
	lk, err := la.Acquire(s.callCtx(t), key, locker.WithTTL(s.unit), locker.WithAutoRenew(false))
	ret := time.Now()
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	s.expectExpiry(t, b, expiry{g: grant{key: key, sent: sent, returned: ret, ttl: lk.TTL()}, what: "refresh after loss"})
	wantErr(t, "Refresh of a lock taken over by another owner", lk.Refresh(s.callCtx(t), s.unit), locker.ErrNotHeld)
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost not closed after Refresh returned ErrNotHeld")
	}
}

// A waiting Acquire whose context ends returns promptly with the context's
// error and leaves nothing held or queued.
func (s *suite) lockerCancelledWait(t *testing.T) {
	la, lb, lc := s.locker(t), s.locker(t), s.locker(t)
	key := newKey(t)
	lk, err := la.Acquire(s.callCtx(t), key, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	wait := s.unit
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	var werr error
	within(t, wait+5*time.Second, "waiting Acquire with an expiring context", func() {
		_, werr = lb.Acquire(ctx, key, locker.WithTTL(s.hold()))
	})
	wantErr(t, "waiting Acquire whose context expired", werr, context.DeadlineExceeded)
	t.Logf("returned %v after the context's %v deadline", time.Since(start)-wait, wait)

	// Cancellation rather than a deadline.
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(s.unit/2, cancel2)
	within(t, s.unit+5*time.Second, "waiting Acquire with a cancelled context", func() {
		_, werr = lb.Acquire(ctx2, key, locker.WithTTL(s.hold()))
	})
	wantErr(t, "waiting Acquire whose context was cancelled", werr, context.Canceled)

	if err := lk.Release(s.callCtx(t)); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The cancelled waiters hold nothing and wait for nothing: a waiter
	// still queued would take the key as it is released, so nobody races it
	// for a moment; then a third locker gets the key well before such a
	// waiter's 30s TTL could have run out.
	time.Sleep(wakeBound / 4)
	waitFor(t, 10*time.Second, "the key to be free after the cancelled waits", func() bool {
		lk, err := lc.TryAcquire(s.callCtx(t), key, locker.WithTTL(s.unit))
		if err == nil {
			_ = lk.Release(s.callCtx(t))
			return true
		}
		if !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("TryAcquire: %v", err)
		}
		return false
	})
}

// Contention: 8 lockers, many rounds each, never two holders at once, and
// tokens strictly increasing in the order the lock was held.
func (s *suite) lockerContention(t *testing.T) {
	const lockers, rounds = 8, 8
	key := newKey(t)
	ls := make([]*locker.Locker, lockers)
	for i := range ls {
		ls[i] = s.locker(t)
	}
	ttl := max(s.unit, time.Second)
	var (
		inside    atomic.Int32
		mu        sync.Mutex
		lastToken uint64
		grants    int
	)
	// Room for every possible report, so a broken driver cannot block a
	// worker on a full channel.
	errs := make(chan error, 3*lockers*rounds)
	var wg sync.WaitGroup
	for i := range lockers {
		wg.Go(func() {
			for r := range rounds {
				lk, err := ls[i].Acquire(s.callCtx(t), key, locker.WithTTL(ttl))
				if err != nil {
					errs <- fmt.Errorf("locker %d round %d: Acquire: %w", i, r, err)
					return
				}
				if n := inside.Add(1); n != 1 {
					errs <- fmt.Errorf("locker %d round %d: %d holders at once", i, r, n)
				}
				mu.Lock()
				if lk.Token() <= lastToken {
					errs <- fmt.Errorf("locker %d round %d: token %d not greater than the previous holder's %d",
						i, r, lk.Token(), lastToken)
				}
				lastToken = lk.Token()
				grants++
				mu.Unlock()
				time.Sleep(time.Millisecond) // the critical section
				inside.Add(-1)
				if err := lk.Release(s.callCtx(t)); err != nil {
					errs <- fmt.Errorf("locker %d round %d: Release: %w", i, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if grants != lockers*rounds {
		t.Fatalf("%d grants, want %d", grants, lockers*rounds)
	}
}

// Close releases the locks still held (their Lost closes), makes a waiting
// Acquire return ErrClosed, is idempotent, and later calls return ErrClosed.
func (s *suite) lockerClose(t *testing.T) {
	la, lb, lc := s.locker(t), s.locker(t), s.locker(t)
	key, other := newKey(t), newKey(t)
	lk, err := la.Acquire(s.callCtx(t), key, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	lo, err := lb.Acquire(s.callCtx(t), other, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	waitErr := make(chan error, 1)
	go func() {
		_, err := lb.Acquire(s.callCtx(t), key)
		waitErr <- err
	}()
	if err := lb.Close(); err != nil {
		t.Fatalf("Close with a lock held and an Acquire waiting: %v", err)
	}
	select {
	case err := <-waitErr:
		wantErr(t, "Acquire waiting across Close", err, locker.ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("waiting Acquire did not return after Close")
	}
	select {
	case <-lo.Lost():
	default:
		t.Fatal("Lost of a lock held across Close is not closed")
	}
	// The closed Locker's lock was released: another locker gets it at once.
	lk2, err := lc.TryAcquire(s.callCtx(t), other, locker.WithTTL(s.unit))
	if err != nil {
		t.Fatalf("TryAcquire of a key whose Locker was closed: %v (Close did not release it)", err)
	}
	_ = lk2.Release(s.callCtx(t))
	if err := lb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err = lb.TryAcquire(s.callCtx(t), newKey(t))
	wantErr(t, "TryAcquire after Close", err, locker.ErrClosed)
	_, err = lb.Acquire(s.callCtx(t), newKey(t))
	wantErr(t, "Acquire after Close", err, locker.ErrClosed)
	_ = lk.Release(s.callCtx(t))
}
