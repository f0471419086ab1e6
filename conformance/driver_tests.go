package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// driverSubtests lists the checks of the raw driver.Locker and its optional
// interfaces, the CPU-heavy ones first.
func (s *suite) driverSubtests() []subtest {
	return []subtest{
		{name: "AtomicAcquire", fn: s.driverAtomicAcquire},
		{name: "ConcurrentUse", fn: s.driverConcurrentUse},
		{name: "Keys", fn: s.driverKeys},
		{name: "MutualExclusion", fn: s.driverMutualExclusion},
		{name: "Expiry", fn: s.driverExpiry},
		{name: "TTL", fn: s.driverTTL},
		{name: "Capabilities", fn: s.driverCapabilities},
		{name: "Ownership", fn: s.driverOwnership},
		{name: "OwnerAcrossLockers", fn: s.driverOwnerAcrossLockers},
		{name: "RefreshTTL", fn: s.driverRefreshTTL},
		{name: "RefreshDoesNotRevive", fn: s.driverRefreshDoesNotRevive},
		{name: "NotHeld", fn: s.driverNotHeld},
		{name: "Expired", fn: s.driverExpired},
		{name: "Fencing", fn: s.driverFencing},
		{name: "IdempotentAcquire", fn: s.driverIdempotent},
		{name: "Context", fn: s.driverContext},
		{name: "BadInput", fn: s.driverBadInput},
		{name: "Close", fn: s.driverClose},
		{name: "Errors", fn: s.driverErrors},
		{name: "HeldError", fn: s.driverHeldError, needs: "HeldError"},
		{name: "Waiter", fn: s.driverWaiter, needs: "Waiter"},
		{name: "WaiterExpiry", fn: s.driverWaiterExpiry, needs: "Waiter"},
		{name: "BlockingAcquirer", fn: s.driverBlocking, needs: "BlockingAcquirer"},
		{name: "BlockingExpiry", fn: s.driverBlockingExpiry, needs: "BlockingAcquirer"},
		{name: "Inspector", fn: s.driverInspector, needs: "Inspector"},
		{name: "Pinger", fn: s.driverPinger, needs: "Pinger"},
		{name: "BatchRefresh", fn: s.driverBatchRefresh, needs: "BatchRefresher"},
		{name: "HoldWatcher", fn: s.driverHoldWatcher, needs: "HoldWatcher"},
		{name: "HoldWatcherExpiry", fn: s.driverHoldWatcherExpiry, needs: "HoldWatcher"},
		{name: "ChangeWatcher", fn: s.driverChangeWatcher, needs: "ChangeWatcher"},
	}
}

// A held key cannot be taken by another owner, through another Locker or
// the holder's own; Acquire makes one attempt (it returns ErrNotAcquired at
// once rather than waiting for the key); Release frees the key at once.
func (s *suite) driverMutualExclusion(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	oa, ob := newOwner(), newOwner()
	s.acquire(t, a, key, oa, ttl)
	for _, c := range []struct {
		d   driver.Locker
		how string
	}{{b, "another Locker"}, {a, "another owner on the holder's Locker"}} {
		var err error
		within(t, quick, "Acquire of a held key by "+c.how, func() {
			_, err = c.d.Acquire(ctxT(t, 2*quick), key, ob, ttl)
		})
		if err == nil {
			t.Fatalf("Acquire of a held key by %s succeeded", c.how)
		}
		wantErr(t, "Acquire of a held key by "+c.how, err, driver.ErrNotAcquired)
	}
	if err := a.Release(s.callCtx(t), key, oa); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
	if _, err := b.Acquire(s.callCtx(t), key, ob, ttl); err != nil {
		t.Fatalf("Acquire right after the holder's Release: %v (Release did not free the key)", err)
	}
	s.mustBeHeld(t, a, key, "after B acquired")
}

// Of many simultaneous acquires of a fresh key, exactly one wins. A
// check-then-set acquire fails this.
func (s *suite) driverAtomicAcquire(t *testing.T) {
	const lockers, perLocker, rounds = 4, 4, 20
	ds := make([]driver.Locker, lockers)
	for i := range ds {
		ds[i] = s.open(t)
	}
	ttl := ttlFor(ds[0], 10*s.unit)
	for r := range rounds {
		key := newKey(t)
		var wins atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make(chan error, lockers*perLocker)
		for i := range lockers * perLocker {
			wg.Go(func() {
				<-start
				_, err := ds[i%lockers].Acquire(s.callCtx(t), key, newOwner(), ttl)
				switch {
				case err == nil:
					wins.Add(1)
				case !errors.Is(err, driver.ErrNotAcquired):
					errs <- err
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: concurrent Acquire: %v", r, err)
		}
		if n := wins.Load(); n != 1 {
			t.Fatalf("round %d: %d of %d concurrent Acquires of one fresh key succeeded, want exactly 1",
				r, n, lockers*perLocker)
		}
	}
}

// One Locker used by many goroutines at once, each on its own key, gives
// each the answers it would get alone.
func (s *suite) driverConcurrentUse(t *testing.T) {
	const goroutines, rounds = 8, 10
	a := s.open(t)
	ttl := ttlFor(a, 10*s.unit)
	base := newKey(t)
	errs := make(chan error, goroutines)
	var wg sync.WaitGroup
	for i := range goroutines {
		wg.Go(func() {
			ctx := s.callCtx(t)
			key := fmt.Sprintf("%s/%d", base, i)
			for r := range rounds {
				o := newOwner()
				tok, err := a.Acquire(ctx, key, o, ttl)
				if err != nil {
					errs <- fmt.Errorf("goroutine %d round %d: Acquire of its own free key: %w", i, r, err)
					return
				}
				if err := a.Refresh(ctx, key, o, ttl); err != nil {
					errs <- fmt.Errorf("goroutine %d round %d: Refresh by the holder: %w", i, r, err)
					return
				}
				if tok2, err := a.Acquire(ctx, key, o, ttl); err != nil || tok2 != tok {
					errs <- fmt.Errorf("goroutine %d round %d: repeated Acquire by the holder = (%d, %v), want (%d, nil)",
						i, r, tok2, err, tok)
					return
				}
				if err := a.Release(ctx, key, o); err != nil {
					errs <- fmt.Errorf("goroutine %d round %d: Release by the holder: %w", i, r, err)
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
}

// A lock that is not refreshed is freed after its TTL: not before (less
// the driver's declared margin), and not much after.
func (s *suite) driverExpiry(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key := newKey(t)
	g := s.acquire(t, a, key, newOwner(), ttlFor(a, s.unit))
	s.expectExpiry(t, b, expiry{g: g, what: "expiry"})
}

// The TTL Acquire is handed is the one that holds: a short one and a long
// one each end when they should, so neither is ignored for a fixed TTL.
func (s *suite) driverTTL(t *testing.T) {
	a, b := s.open(t), s.open(t)
	short := s.acquire(t, a, newKey(t), newOwner(), ttlFor(a, s.unit))
	long := s.acquire(t, a, newKey(t), newOwner(), ttlFor(a, s.long()))
	s.expectExpiry(t, b,
		expiry{g: short, what: "Acquire with a TTL of " + fmtDur(short.ttl)},
		expiry{g: long, what: "Acquire with a TTL of " + fmtDur(long.ttl)})
}

// Capabilities hold: a TTL of MinTTL is honoured; a TTL below MinTTL is
// rounded up to it (or rejected with ErrInvalid), never kept shorter; a TTL
// that is not a multiple of TTLGranularity is rounded up, never down.
func (s *suite) driverCapabilities(t *testing.T) {
	a, b := s.open(t), s.open(t)
	c := s.caps
	minTTL := c.MinTTL
	if minTTL <= 0 {
		minTTL = 20 * time.Millisecond // any positive TTL: try a short one
	}
	var es []expiry
	g := s.acquire(t, a, newKey(t), newOwner(), minTTL)
	es = append(es, expiry{g: g, what: "a TTL of MinTTL (" + fmtDur(minTTL) + ")"})
	if c.MinTTL > 0 {
		key, raw := newKey(t), c.MinTTL/2
		g := grant{key: key, sent: time.Now(), ttl: c.RoundTTL(raw)}
		_, err := a.Acquire(s.callCtx(t), key, newOwner(), raw)
		g.returned = time.Now()
		switch {
		case err == nil:
			es = append(es, expiry{g: g, what: fmt.Sprintf("a TTL of %v, below MinTTL %v", raw, c.MinTTL)})
		case errors.Is(err, driver.ErrInvalid):
			s.mustBeFree(t, b, key, "after an Acquire rejected for a TTL below MinTTL")
		default:
			t.Fatalf("Acquire with a TTL of %v, below MinTTL %v: %v", raw, c.MinTTL, err)
		}
	}
	odd := s.unit + s.unit/2
	if gr := c.TTLGranularity; gr > 0 {
		odd = c.RoundTTL(s.unit) + gr/2
	}
	g = s.acquire(t, a, newKey(t), newOwner(), odd)
	es = append(es, expiry{g: g, what: fmt.Sprintf("a TTL of %v (granularity %v, kept as %v)", odd, c.TTLGranularity, g.ttl)})
	s.expectExpiry(t, b, es...)
}

// Nobody but the holder can refresh or release, and their attempts change
// nothing: not an owner that differs from the holder's by one byte, nor one
// that is a prefix of it, nor a former holder whose lock expired and was
// taken by someone else.
func (s *suite) driverOwnership(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.long())
	base := newOwner() + newOwner()
	oa := base + "-a"
	g := s.acquire(t, a, key, oa, ttl)
	longer := ttlFor(a, 3*s.long())
	for _, o := range []string{newOwner(), base + "-b", base, base + "-a-", strings.ToUpper(oa)} {
		for _, d := range []driver.Locker{a, b} {
			wantErr(t, fmt.Sprintf("Release by another owner (%q)", o), d.Release(s.callCtx(t), key, o), driver.ErrNotHeld)
			wantErr(t, fmt.Sprintf("Refresh by another owner (%q)", o), d.Refresh(s.callCtx(t), key, o, longer), driver.ErrNotHeld)
		}
	}
	s.mustBeHeld(t, b, key, "after foreign Releases and Refreshes")
	// The foreign Refreshes, with a longer TTL, did not extend the lock.
	p := s.expectExpiry(t, b, expiry{g: g, what: "a lock others tried to refresh"})[0]

	// A is now a former holder.
	_, err := a.Acquire(s.callCtx(t), key, oa, ttl)
	wantErr(t, "Acquire by a former holder of a lock another owner took over", err, driver.ErrNotAcquired)
	wantErr(t, "Refresh by a former holder", a.Refresh(s.callCtx(t), key, oa, ttl), driver.ErrNotHeld)
	wantErr(t, "Release by a former holder", a.Release(s.callCtx(t), key, oa), driver.ErrNotHeld)
	s.mustBeHeld(t, a, key, "after the former holder's Refresh and Release")
	if err := b.Release(s.callCtx(t), key, p.owner); err != nil {
		t.Fatalf("Release by the new holder: %v", err)
	}
}

// The owner, not the Locker, holds a lock: the same owner string through
// another Locker (a process handing a lock over, as locker.WithOwner
// allows) is the holder: its Acquire returns the same token, its Refresh
// and Release succeed.
//
// A driver that declares Capabilities.LockerBound keeps the lock with the
// Locker that took it instead: through another Locker, the same owner's
// Acquire is refused, its Refresh and Release return ErrNotHeld, and none
// of them changes the lock.
func (s *suite) driverOwnerAcrossLockers(t *testing.T) {
	a, b, c := s.open(t), s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	o := newOwner()
	g := s.acquire(t, a, key, o, ttl)
	if s.caps.LockerBound {
		_, err := b.Acquire(s.callCtx(t), key, o, ttl)
		wantErr(t, "Acquire by the holder's owner through another Locker of a LockerBound driver", err, driver.ErrNotAcquired)
		wantErr(t, "Refresh by the holder's owner through another Locker of a LockerBound driver",
			b.Refresh(s.callCtx(t), key, o, ttl), driver.ErrNotHeld)
		wantErr(t, "Release by the holder's owner through another Locker of a LockerBound driver",
			b.Release(s.callCtx(t), key, o), driver.ErrNotHeld)
		s.mustBeHeld(t, c, key, "after the same owner's calls through another Locker of a LockerBound driver")
		if tok, err := a.Acquire(s.callCtx(t), key, o, ttl); err != nil || tok != g.token {
			t.Fatalf("idempotent Acquire through the Locker that holds the key: token %d, %v; want %d", tok, err, g.token)
		}
		if err := a.Release(s.callCtx(t), key, o); err != nil {
			t.Fatalf("Release through the Locker that holds the key: %v", err)
		}
		s.mustBeFree(t, c, key, "after the holding Locker released it")
		return
	}
	tok, err := b.Acquire(s.callCtx(t), key, o, ttl)
	if err != nil {
		t.Fatalf("Acquire by the holder's owner through another Locker: %v", err)
	}
	if tok != g.token {
		t.Fatalf("Acquire by the holder's owner through another Locker returned token %d, want the holder's %d", tok, g.token)
	}
	if err := b.Refresh(s.callCtx(t), key, o, ttl); err != nil {
		t.Fatalf("Refresh by the holder's owner through another Locker: %v", err)
	}
	if err := b.Release(s.callCtx(t), key, o); err != nil {
		t.Fatalf("Release by the holder's owner through another Locker: %v", err)
	}
	s.mustBeFree(t, c, key, "after the owner released it through another Locker")
}

// Refresh resets the TTL to the one it is handed, longer or shorter than
// the one in force, counted from the Refresh.
func (s *suite) driverRefreshTTL(t *testing.T) {
	a, b := s.open(t), s.open(t)
	short, medium, long := ttlFor(a, s.unit), ttlFor(a, s.medium()), ttlFor(a, s.long())
	k1, k2, o := newKey(t), newKey(t), newOwner()
	s.acquire(t, a, k1, o, medium)
	g1 := s.refresh(t, a, k1, o, long, 0)
	s.acquire(t, a, k2, o, long)
	g2 := s.refresh(t, a, k2, o, short, 0)
	s.expectExpiry(t, b,
		expiry{g: g1, what: fmt.Sprintf("Refresh to a longer TTL (%v → %v)", medium, long)},
		expiry{g: g2, what: fmt.Sprintf("Refresh to a shorter TTL (%v → %v)", long, short)})
}

// A Refresh after the TTL ran out returns ErrNotHeld and does not bring the
// lock back, even when nobody else took the key.
func (s *suite) driverRefreshDoesNotRevive(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.unit)
	oa := newOwner()
	g := s.acquire(t, a, key, oa, ttl)
	s.waitExpired(t, a, g)
	wantErr(t, "Refresh of an expired lock", a.Refresh(s.callCtx(t), key, oa, ttl), driver.ErrNotHeld)
	if _, err := b.Acquire(s.callCtx(t), key, newOwner(), ttl); err != nil {
		t.Fatalf("Acquire after the holder's Refresh of its expired lock: %v (the Refresh revived it)", err)
	}
}

// Refresh and Release of a lock the caller does not hold — a key never
// taken, a lock already released — return ErrNotHeld and change nothing:
// the key stays free.
func (s *suite) driverNotHeld(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ttl := ttlFor(a, s.hold())
	never, released, o := newKey(t), newKey(t), newOwner()
	s.acquire(t, a, released, o, ttl)
	if err := a.Release(s.callCtx(t), released, o); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
	for _, c := range []struct{ key, state string }{{never, "a key never taken"}, {released, "a released lock"}} {
		wantErr(t, "Refresh of "+c.state, a.Refresh(s.callCtx(t), c.key, o, ttl), driver.ErrNotHeld)
		wantErr(t, "Release of "+c.state, a.Release(s.callCtx(t), c.key, o), driver.ErrNotHeld)
		wantErr(t, "second Release of "+c.state, a.Release(s.callCtx(t), c.key, o), driver.ErrNotHeld)
		s.mustBeFree(t, b, c.key, "after Refresh and Release of "+c.state)
	}
}

// An expired lock, on every method: Release returns ErrNotHeld, Inspect
// reports the key free, an Acquire and an AcquireWait by the former owner
// are new grants with greater tokens. (Refresh: Driver/RefreshDoesNotRevive.)
func (s *suite) driverExpired(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ttl := ttlFor(a, s.unit)
	o := newOwner()
	kRel, kAcq, kIns, kWait := newKey(t), newKey(t), newKey(t), newKey(t)
	gs := map[string]grant{}
	for _, k := range []string{kRel, kAcq, kIns, kWait} {
		gs[k] = s.acquire(t, a, k, o, ttl)
	}
	for _, k := range []string{kRel, kAcq, kIns, kWait} {
		s.waitExpired(t, a, gs[k])
	}
	if in, ok := a.(driver.Inspector); ok {
		_, err := in.Inspect(s.callCtx(t), kIns)
		wantErr(t, "Inspect of an expired lock", err, driver.ErrNotHeld)
	}
	wantErr(t, "Release of an expired lock by its former holder", a.Release(s.callCtx(t), kRel, o), driver.ErrNotHeld)
	s.mustBeFree(t, b, kRel, "after the former holder's Release of its expired lock")
	tok, err := a.Acquire(s.callCtx(t), kAcq, o, ttl)
	if err != nil {
		t.Fatalf("Acquire of its expired lock by the former holder: %v", err)
	}
	if tok <= gs[kAcq].token {
		t.Fatalf("Acquire of its expired lock by the former holder returned token %d, not greater than the expired grant's %d: "+
			"it revived the old grant instead of making a new one", tok, gs[kAcq].token)
	}
	if ba, ok := a.(driver.BlockingAcquirer); ok {
		var tok uint64
		var err error
		within(t, quick, "AcquireWait of its expired lock by the former holder", func() {
			tok, err = ba.AcquireWait(s.callCtx(t), kWait, o, ttl)
		})
		if err != nil {
			t.Fatalf("AcquireWait of its expired lock by the former holder: %v", err)
		}
		if tok <= gs[kWait].token {
			t.Fatalf("AcquireWait of its expired lock by the former holder returned token %d, not greater than the expired grant's %d",
				tok, gs[kWait].token)
		}
	}
}

// Every grant's token is strictly greater than every earlier grant's, across
// release, expiry and re-acquire, by any Locker and any owner (the same
// owner included), whatever happens to other keys.
func (s *suite) driverFencing(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.unit)
	var last uint64
	next := func(tok uint64, how string) {
		t.Helper()
		if tok <= last {
			t.Fatalf("token %d after %s is not greater than the previous grant's token %d", tok, how, last)
		}
		last = tok
	}
	same := newOwner()
	for i := range 6 {
		d := []driver.Locker{a, b}[i%2]
		o := newOwner()
		if i >= 4 {
			o = same
		}
		// A TTL no subtest outlives: the release must find the lock held
		// however slow the machine.
		next(s.acquire(t, d, key, o, ttlFor(d, s.hold())).token, "a re-acquire following a release")
		if err := d.Release(s.callCtx(t), key, o); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// Across expiry, taken by another owner.
	g := s.acquire(t, a, key, same, ttl)
	next(g.token, "a release")
	p := s.expectExpiry(t, b, expiry{g: g, what: "fencing"})[0]
	next(p.token, "an expiry")
	if err := b.Release(s.callCtx(t), key, p.owner); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// Other keys' grants do not let this key's tokens repeat; an expiry
	// with no one waiting does not either.
	other, o := newKey(t), newOwner()
	s.acquire(t, a, other, o, ttl)
	_ = a.Release(s.callCtx(t), other, o)
	g = s.acquire(t, a, key, same, ttl)
	next(g.token, "a release and another key's grant")
	s.waitExpired(t, b, g)
	next(s.acquire(t, a, key, newOwner(), ttl).token, "an expiry with no one waiting")
}

// Acquire by the current owner succeeds, returns the same token and resets
// the TTL to the one it is handed, longer or shorter.
func (s *suite) driverIdempotent(t *testing.T) {
	a, b := s.open(t), s.open(t)
	short, medium, long := ttlFor(a, s.unit), ttlFor(a, s.medium()), ttlFor(a, s.long())
	k1, k2, o := newKey(t), newKey(t), newOwner()
	again := func(key string, first grant, ttl time.Duration) grant {
		t.Helper()
		g := grant{key: key, sent: time.Now(), ttl: s.effective(ttl)}
		tok, err := a.Acquire(s.callCtx(t), key, o, ttl)
		g.returned = time.Now()
		if err != nil {
			t.Fatalf("repeated Acquire by the holder: %v", err)
		}
		if tok != first.token {
			t.Fatalf("repeated Acquire by the holder returned token %d, want the same token %d", tok, first.token)
		}
		g.token = tok
		return g
	}
	g1 := again(k1, s.acquire(t, a, k1, o, medium), long)
	g2 := again(k2, s.acquire(t, a, k2, o, long), short)
	s.expectExpiry(t, b,
		expiry{g: g1, what: fmt.Sprintf("a repeated Acquire with a longer TTL (%v → %v)", medium, long)},
		expiry{g: g2, what: fmt.Sprintf("a repeated Acquire with a shorter TTL (%v → %v)", long, short)})
}

// Calls return promptly once ctx is done, with ctx.Err() wrapped, and change
// nothing: an Acquire leaves nothing held, a Refresh or Release leaves the
// lock as it was.
func (s *suite) driverContext(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	o := newOwner()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	dones := []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}}

	for _, c := range dones {
		var err error
		within(t, quick, "Acquire with a done context", func() { _, err = a.Acquire(c.ctx, key, o, ttl) })
		wantErr(t, "Acquire with a done context", err, c.want)
	}
	ob := s.mustBeFree(t, b, key, "after Acquires with done contexts")

	for _, c := range dones {
		var err error
		within(t, quick, "Refresh with a done context", func() { err = b.Refresh(c.ctx, key, ob, ttl) })
		wantErr(t, "Refresh with a done context", err, c.want)
		within(t, quick, "Release with a done context", func() { err = b.Release(c.ctx, key, ob) })
		wantErr(t, "Release with a done context", err, c.want)
		if in, ok := a.(driver.Inspector); ok {
			within(t, quick, "Inspect with a done context", func() { _, err = in.Inspect(c.ctx, key) })
			wantErr(t, "Inspect with a done context", err, c.want)
		}
		if p, ok := a.(driver.Pinger); ok {
			within(t, quick, "Ping with a done context", func() { err = p.Ping(c.ctx) })
			wantErr(t, "Ping with a done context", err, c.want)
		}
	}
	s.mustBeHeld(t, a, key, "after a Release with a done context")
}

// Any non-empty string is a key, and keys never interfere.
func (s *suite) driverKeys(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ttl := ttlFor(a, s.hold())
	base := newKey(t)
	keys := []string{
		base + "/plain", base + "/Plain", base + "/plain ", base + "/plain/", base + "/" + strings.Repeat("x", 1000),
		base + "/{tag}", base + "/{", base + "/}", base + "/*?[", base + "/ünïcødé ✓", base + "/colon:x",
		base + "/new\nline", base + "/quote'\"", base + "/nul\x00byte", base + "/%2F", base + "/..",
	}
	owners := make([]string, len(keys))
	for i, k := range keys {
		owners[i] = newOwner()
		s.acquire(t, a, k, owners[i], ttl)
	}
	for _, k := range keys {
		s.mustBeHeld(t, b, k, "each key")
	}
	// Releasing one key frees that key only.
	if err := a.Release(s.callCtx(t), keys[0], owners[0]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	s.mustBeFree(t, b, keys[0], "after its Release")
	for _, k := range keys[1:] {
		s.mustBeHeld(t, b, k, "after releasing a similar key")
	}
	// Many keys at once, none blocking another.
	for i := range 50 {
		s.acquire(t, b, base+"/many/"+string(rune('a'+i%26))+strings.Repeat("-", i), newOwner(), ttl)
	}
}

// Bad input is rejected with ErrInvalid and changes nothing: an empty key
// on every method, a non-positive TTL on every method that takes one.
func (s *suite) driverBadInput(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ttl := ttlFor(a, s.unit)
	ctx := s.callCtx(t)
	_, err := a.Acquire(ctx, "", newOwner(), ttl)
	wantErr(t, "Acquire with an empty key", err, driver.ErrInvalid)
	wantErr(t, "Refresh with an empty key", a.Refresh(ctx, "", newOwner(), ttl), driver.ErrInvalid)
	wantErr(t, "Release with an empty key", a.Release(ctx, "", newOwner()), driver.ErrInvalid)
	in, hasInspect := a.(driver.Inspector)
	if hasInspect {
		_, err := in.Inspect(ctx, "")
		wantErr(t, "Inspect with an empty key", err, driver.ErrInvalid)
	}
	ba, hasWait := a.(driver.BlockingAcquirer)
	if hasWait {
		within(t, quick, "AcquireWait with an empty key", func() { _, err = ba.AcquireWait(ctx, "", newOwner(), ttl) })
		wantErr(t, "AcquireWait with an empty key", err, driver.ErrInvalid)
	}
	for _, bad := range []time.Duration{0, -time.Second} {
		key := newKey(t)
		_, err := a.Acquire(ctx, key, newOwner(), bad)
		wantErr(t, "Acquire with TTL "+bad.String(), err, driver.ErrInvalid)
		if hasWait {
			within(t, quick, "AcquireWait with TTL "+bad.String(), func() { _, err = ba.AcquireWait(ctx, key, newOwner(), bad) })
			wantErr(t, "AcquireWait with TTL "+bad.String(), err, driver.ErrInvalid)
		}
		s.mustBeFree(t, b, key, "after an Acquire with TTL "+bad.String())
	}
	// A rejected Refresh leaves the lock as it was: held, and ending when its
	// own TTL says. The TTL is long enough that "still held" does not race
	// the expiry on a loaded machine.
	key, o := newKey(t), newOwner()
	g := s.acquire(t, a, key, o, ttlFor(a, 5*s.unit))
	for _, bad := range []time.Duration{0, -time.Second} {
		wantErr(t, "Refresh with TTL "+bad.String(), a.Refresh(ctx, key, o, bad), driver.ErrInvalid)
	}
	s.mustBeHeld(t, b, key, "after Refreshes with bad TTLs")
	s.expectExpiry(t, b, expiry{g: g, what: "a lock after Refreshes with bad TTLs"})
}

// Close is idempotent; every later call, of every interface, returns
// ErrClosed; locks still held are not kept alive: they end by their TTL.
func (s *suite) driverClose(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.unit)
	held := s.acquire(t, a, key, newOwner(), ttl)
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil && !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("second Close: got %v, want nil or ErrClosed", err)
	}
	ctx := s.callCtx(t)
	k2 := newKey(t)
	_, err := a.Acquire(ctx, k2, newOwner(), ttl)
	wantErr(t, "Acquire after Close", err, driver.ErrClosed)
	wantErr(t, "Refresh after Close", a.Refresh(ctx, k2, newOwner(), ttl), driver.ErrClosed)
	wantErr(t, "Release after Close", a.Release(ctx, k2, newOwner()), driver.ErrClosed)
	if in, ok := a.(driver.Inspector); ok {
		_, err := in.Inspect(ctx, k2)
		wantErr(t, "Inspect after Close", err, driver.ErrClosed)
	}
	if w, ok := a.(driver.Waiter); ok {
		var cancel func()
		within(t, quick, "Subscribe after Close", func() { _, cancel, err = w.Subscribe(ctx, k2) })
		if err == nil {
			cancel()
		}
		wantErr(t, "Subscribe after Close", err, driver.ErrClosed)
	}
	if ba, ok := a.(driver.BlockingAcquirer); ok {
		within(t, quick, "AcquireWait after Close", func() { _, err = ba.AcquireWait(ctx, k2, newOwner(), ttl) })
		wantErr(t, "AcquireWait after Close", err, driver.ErrClosed)
	}
	if p, ok := a.(driver.Pinger); ok {
		wantErr(t, "Ping after Close", p.Ping(ctx), driver.ErrClosed)
	}
	if w, ok := a.(driver.HoldWatcher); ok {
		var stop func()
		within(t, quick, "WatchHold after Close", func() { stop, err = w.WatchHold(key, "someone", 1, func(error) {}) })
		if err == nil {
			stop()
		}
		wantErr(t, "WatchHold after Close", err, driver.ErrClosed)
	}
	s.mustBeFree(t, b, k2, "after calls on a closed Locker")
	s.expectExpiry(t, b, expiry{g: held, what: "a lock held across Close", onlyLatest: true})
}

// Driver errors carry no "locker:" prefix: package locker adds it, once.
func (s *suite) driverErrors(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ctx := s.callCtx(t)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	o := newOwner()
	s.acquire(t, a, key, o, ttl)
	var errs []error
	_, err := b.Acquire(ctx, key, newOwner(), ttl)
	errs = append(errs, err)
	errs = append(errs, b.Release(ctx, key, newOwner()), b.Refresh(ctx, key, newOwner(), ttl))
	_, err = b.Acquire(ctx, "", newOwner(), ttl)
	errs = append(errs, err)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b.Acquire(cancelled, newKey(t), newOwner(), ttl)
	errs = append(errs, err)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = b.Acquire(ctx, newKey(t), newOwner(), ttl)
	errs = append(errs, err)
	for _, err := range errs {
		if err == nil {
			t.Fatal("a call that must fail succeeded (the other subtests say which)")
		}
		if strings.HasPrefix(err.Error(), "locker:") {
			t.Errorf("driver error %q starts with \"locker:\": package locker adds that prefix itself", err)
		}
	}
}
