package conformance

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// A *HeldError's Remaining is the holder's remaining TTL as the server saw
// it: it counts down from the TTL the holder was granted, and is neither
// more than the lock can have left nor less.
func (s *suite) driverHeldError(t *testing.T) {
	a, b := s.open(t), s.open(t)
	key, ttl := newKey(t), ttlFor(a, s.long())
	g := s.acquire(t, a, key, newOwner(), ttl)
	checked := 0
	check := func(when string) {
		t.Helper()
		sent := time.Now()
		_, err := b.Acquire(s.callCtx(t), key, newOwner(), ttl)
		ret := time.Now()
		wantErr(t, "Acquire of a held key "+when, err, driver.ErrNotAcquired)
		var he *driver.HeldError
		if !errors.As(err, &he) || he.Remaining <= 0 {
			t.Logf("%s: no remaining TTL reported (%v)", when, err)
			return
		}
		checked++
		hi := s.latest(g).Sub(sent)
		lo := s.earliest(g).Sub(ret) - max(s.caps.TTLGranularity, time.Millisecond)
		if he.Remaining > hi {
			t.Fatalf("%s: HeldError.Remaining = %v, more than the holder's lock (TTL %v, granted %v earlier) can have left (%v): "+
				"it does not count down", when, he.Remaining, ttl, fmtDur(sent.Sub(g.sent)), fmtDur(hi))
		}
		if he.Remaining < lo {
			t.Fatalf("%s: HeldError.Remaining = %v, less than the holder's lock (TTL %v, granted %v earlier) has left (at least %v)",
				when, he.Remaining, ttl, fmtDur(sent.Sub(g.sent)), fmtDur(lo))
		}
	}
	check("just after the grant")
	// Later than late(ttl) into the lock's life, so that a Remaining that
	// does not count down is more than the lock can have left.
	time.Sleep(time.Until(g.returned.Add(late(ttl) + s.unit)))
	check(fmtDur(time.Since(g.sent)) + " into the holder's TTL")
	if checked == 0 {
		t.Fatal("Acquire of a held key never returned a *HeldError with a remaining TTL, although it did when Run probed the driver")
	}
}

// A subscriber is woken by every release: one right after Subscribe
// returned, each later one, and one whose wake-up was sent while nobody
// was receiving (the channel is buffered). cancel ends the subscription
// and may be called twice. Subscribe with a done context returns its error.
func (s *suite) driverWaiter(t *testing.T) {
	a, b := s.open(t), s.open(t)
	w := b.(driver.Waiter)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	cycle := func(wake <-chan struct{}, what string, lag time.Duration) {
		t.Helper()
		o := newOwner()
		if _, err := a.Acquire(s.callCtx(t), key, o, ttl); err != nil {
			t.Fatalf("%s: Acquire: %v", what, err)
		}
		drainWake(wake) // spurious wake-ups are allowed
		released := time.Now()
		if err := a.Release(s.callCtx(t), key, o); err != nil {
			t.Fatalf("%s: Release: %v", what, err)
		}
		time.Sleep(lag) // not receiving while the wake-up is sent
		select {
		case <-wake:
		case <-time.After(wakeBound):
			t.Fatalf("%s: subscriber not woken within %v of a release (the holder's TTL is %v)",
				what, fmtDur(time.Since(released)), ttl)
		}
	}
	o := newOwner()
	if _, err := a.Acquire(s.callCtx(t), key, o, ttl); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	wake, cancel, err := w.Subscribe(s.callCtx(t), key)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer cancel()
	if err := a.Release(s.callCtx(t), key, o); err != nil {
		t.Fatalf("Release: %v", err)
	}
	select {
	case <-wake:
	case <-time.After(wakeBound):
		t.Fatalf("subscriber not woken within %v of a release made right after Subscribe returned", wakeBound)
	}
	cycle(wake, "second release", 0)
	cycle(wake, "third release", 0)
	cycle(wake, "a release whose wake-up was sent while nobody received", wakeBound/4)

	// cancel ends the subscription. A second subscription on the same
	// Locker is the barrier: once it has seen two later releases, the
	// first has received whatever it was sent before cancel.
	wake2, cancel2, err := w.Subscribe(s.callCtx(t), key)
	if err != nil {
		t.Fatalf("second Subscribe: %v", err)
	}
	defer cancel2()
	cancel()
	cancel() // idempotent
	cycle(wake2, "barrier release", 0)
	drainWake(wake)
	cycle(wake2, "release after cancel", 0)
	cycle(wake2, "barrier release", 0)
	select {
	case <-wake:
		t.Fatal("a cancelled subscription was woken by a release made after cancel returned")
	default:
	}

	for _, c := range []struct {
		ctx  func() context.Context
		want error
	}{
		{func() context.Context { ctx, c := context.WithCancel(context.Background()); c(); return ctx }, context.Canceled},
		{func() context.Context { return ctxT(t, -time.Second) }, context.DeadlineExceeded},
	} {
		var cancel func()
		within(t, quick, "Subscribe with a done context", func() { _, cancel, err = w.Subscribe(c.ctx(), key) })
		if err == nil {
			cancel()
			t.Fatalf("Subscribe with a done context succeeded")
		}
		wantErr(t, "Subscribe with a done context", err, c.want)
	}
}

// A subscriber is woken when the holder's lock expires, unless the
// driver's Acquire reports the holder's remaining TTL in a HeldError, which
// package locker wakes itself at (Driver/HeldError checks its value).
func (s *suite) driverWaiterExpiry(t *testing.T) {
	a, b := s.open(t), s.open(t)
	w := b.(driver.Waiter)
	key := newKey(t)
	wake, cancel, err := w.Subscribe(s.callCtx(t), key)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer cancel()
	g := s.acquire(t, a, key, newOwner(), ttlFor(a, s.unit))
	var held *driver.HeldError
	if _, err := b.Acquire(s.callCtx(t), key, newOwner(), ttlFor(b, s.unit)); errors.As(err, &held) && held.Remaining > 0 {
		return // the expiry is signalled through HeldError.Remaining
	} else if err == nil {
		t.Fatalf("another owner acquired %q while it was held", key)
	}
	deadline := time.NewTimer(time.Until(s.latest(g).Add(wakeBound)))
	defer deadline.Stop()
	for {
		select {
		case <-wake:
			// Spurious unless the key is free now.
			if _, err := b.Acquire(s.callCtx(t), key, newOwner(), ttlFor(b, 10*s.unit)); err == nil {
				return
			} else if !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire after a wake-up: %v", err)
			}
		case <-deadline.C:
			t.Fatalf("subscriber not woken by the expiry of a lock with TTL %v (%v after the grant; the suite allows %v past the TTL, plus %v)",
				g.ttl, fmtDur(time.Since(g.sent)), late(g.ttl), wakeBound)
		}
	}
}

type waitResult struct {
	tok uint64
	err error
	at  time.Time
}

// waitAsync runs AcquireWait in the background; the result arrives on the
// returned channel.
func (s *suite) waitAsync(t *testing.T, ba driver.BlockingAcquirer, ctx context.Context, key, owner string, ttl time.Duration) <-chan waitResult {
	got := make(chan waitResult, 1)
	go func() {
		tok, err := ba.AcquireWait(ctx, key, owner, ttl)
		got <- waitResult{tok, err, time.Now()}
	}()
	return got
}

// AcquireWait is Acquire that waits: on a free key it returns at once with
// the TTL it is handed; for the current owner it returns the same token at
// once; while another owner holds the key it waits, and it is granted
// promptly after the release, not before. When its context ends first it
// returns the context's error and leaves nothing held or queued.
func (s *suite) driverBlocking(t *testing.T) {
	a, b, c := s.open(t), s.open(t), s.open(t)
	aw, ba := a.(driver.BlockingAcquirer), b.(driver.BlockingAcquirer)
	waitGrant := func(d driver.BlockingAcquirer, key, owner string, ttl time.Duration) grant {
		t.Helper()
		g := grant{key: key, sent: time.Now(), ttl: s.effective(ttl)}
		var err error
		within(t, quick, "AcquireWait of a free key", func() { g.token, err = d.AcquireWait(s.callCtx(t), key, owner, ttl) })
		g.returned = time.Now()
		if err != nil {
			t.Fatalf("AcquireWait of a free key: %v", err)
		}
		return g
	}
	short := waitGrant(ba, newKey(t), newOwner(), ttlFor(b, s.unit))
	long := waitGrant(ba, newKey(t), newOwner(), ttlFor(b, s.long()))

	key, ttl := newKey(t), ttlFor(a, s.hold())
	oa := newOwner()
	tokA := s.acquire(t, a, key, oa, ttl).token
	var tok uint64
	var err error
	within(t, quick, "AcquireWait by the holder's owner", func() { tok, err = aw.AcquireWait(s.callCtx(t), key, oa, ttl) })
	if err != nil || tok != tokA {
		t.Fatalf("AcquireWait by the holder's owner = (%d, %v), want the same token %d at once", tok, err, tokA)
	}

	// Waits whose context ends first.
	ctx, cancel := context.WithTimeout(context.Background(), s.unit)
	defer cancel()
	within(t, s.unit+quick, "AcquireWait with an expiring context", func() {
		_, err = ba.AcquireWait(ctx, key, newOwner(), ttl)
	})
	wantErr(t, "AcquireWait on a held key until its context expired", err, context.DeadlineExceeded)
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(s.unit/2, cancel2)
	within(t, s.unit+quick, "AcquireWait with a cancelled context", func() {
		_, err = ba.AcquireWait(ctx2, key, newOwner(), ttl)
	})
	wantErr(t, "AcquireWait on a held key whose context was cancelled", err, context.Canceled)

	// A wait that is granted on release, and only then.
	ob := newOwner()
	got := s.waitAsync(t, ba, s.callCtx(t), key, ob, ttl)
	select {
	case r := <-got:
		t.Fatalf("AcquireWait returned (token %d, %v) while the key was held", r.tok, r.err)
	case <-time.After(max(2*s.unit, 500*time.Millisecond)):
	}
	released := time.Now()
	if err := a.Release(s.callCtx(t), key, oa); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var r waitResult
	select {
	case r = <-got:
	case <-time.After(wakeBound):
		t.Fatalf("AcquireWait not granted within %v of the release", wakeBound)
	}
	if r.err != nil {
		t.Fatalf("AcquireWait: %v", r.err)
	}
	notBefore(t, "AcquireWait was granted", r.at, released)
	if r.tok <= tokA {
		t.Fatalf("AcquireWait token %d is not greater than the previous holder's %d", r.tok, tokA)
	}
	s.mustBeHeld(t, c, key, "after AcquireWait was granted")
	if err := b.Release(s.callCtx(t), key, ob); err != nil {
		t.Fatalf("Release after AcquireWait: %v", err)
	}
	// The waits that ended are not holding or queued: a wait still queued
	// would take the key as it is released, so nobody races it for a moment;
	// then the key is free.
	time.Sleep(wakeBound / 4)
	s.mustBeFree(t, c, key, "after the granted waiter released it")
	s.expectExpiry(t, c,
		expiry{g: short, what: "AcquireWait with a TTL of " + fmtDur(short.ttl)},
		expiry{g: long, what: "AcquireWait with a TTL of " + fmtDur(long.ttl)})
}

// A blocked AcquireWait is granted when the holder's lock expires.
func (s *suite) driverBlockingExpiry(t *testing.T) {
	a, b := s.open(t), s.open(t)
	ba := b.(driver.BlockingAcquirer)
	key := newKey(t)
	g := s.acquire(t, a, key, newOwner(), ttlFor(a, s.unit))
	got := s.waitAsync(t, ba, s.callCtx(t), key, newOwner(), ttlFor(b, 10*s.unit))
	var r waitResult
	select {
	case r = <-got:
	case <-time.After(time.Until(s.latest(g).Add(wakeBound))):
		t.Fatalf("AcquireWait not granted by the expiry of the holder's lock (TTL %v; %v after the grant)",
			g.ttl, fmtDur(time.Since(g.sent)))
	}
	if r.err != nil {
		t.Fatalf("AcquireWait: %v", r.err)
	}
	notBefore(t, "AcquireWait was granted", r.at, s.earliest(g))
	if r.tok <= g.token {
		t.Fatalf("AcquireWait token %d is not greater than the expired holder's %d", r.tok, g.token)
	}
}

// Inspect reports the current holder (owner, token, and a remaining TTL
// that fits the TTL last set), ErrNotHeld for a free key, and changes
// nothing: a lock inspected all along still expires when its TTL says.
func (s *suite) driverInspector(t *testing.T) {
	a, b := s.open(t), s.open(t)
	in := b.(driver.Inspector)
	key, ttl := newKey(t), ttlFor(a, s.long())
	_, err := in.Inspect(s.callCtx(t), key)
	wantErr(t, "Inspect of a free key", err, driver.ErrNotHeld)
	oa := newOwner()
	inspect := func(g grant, owner, what string) {
		t.Helper()
		sent := time.Now()
		info, err := in.Inspect(s.callCtx(t), key)
		ret := time.Now()
		if err != nil {
			t.Fatalf("Inspect %s: %v", what, err)
		}
		if info.Owner != owner || info.Token != g.token {
			t.Fatalf("Inspect %s = owner %q token %d, want owner %q token %d", what, info.Owner, info.Token, owner, g.token)
		}
		gran := max(s.caps.TTLGranularity, time.Millisecond)
		hi := min(s.latest(g).Sub(sent), g.ttl+gran)
		lo := s.earliest(g).Sub(ret) - gran
		if info.Remaining <= 0 || info.Remaining > hi || info.Remaining < lo {
			t.Fatalf("Inspect %s: remaining TTL %v, want one that fits the TTL of %v set %v earlier: in [%v, %v]",
				what, info.Remaining, g.ttl, fmtDur(sent.Sub(g.sent)), fmtDur(max(lo, 0)), fmtDur(hi))
		}
	}
	g := s.acquire(t, a, key, oa, ttl)
	inspect(g, oa, "of a held key")
	g2 := s.refresh(t, a, key, oa, ttlFor(a, s.unit), g.token)
	inspect(g2, oa, "after a Refresh to a shorter TTL")
	// Inspect polls until the lock has expired: it must not keep it alive.
	s.waitExpired(t, b, g2)
	p := s.expectExpiry(t, a, expiry{g: g2, what: "a lock inspected all along"})[0]
	inspect(grant{key: key, token: p.token, sent: p.sent, returned: p.at, ttl: s.effective(ttlFor(a, 10*s.unit))},
		p.owner, "after another owner took the key")
	if err := a.Release(s.callCtx(t), key, p.owner); err != nil {
		t.Fatalf("Release: %v", err)
	}
	_, err = in.Inspect(s.callCtx(t), key)
	wantErr(t, "Inspect after Release", err, driver.ErrNotHeld)
	s.mustBeFree(t, a, key, "after Inspects of a free key")
}

// Ping succeeds on a reachable backend.
func (s *suite) driverPinger(t *testing.T) {
	p := s.open(t).(driver.Pinger)
	var err error
	within(t, quick, "Ping", func() { err = p.Ping(s.callCtx(t)) })
	if err != nil {
		t.Fatalf("Ping of a reachable backend: %v", err)
	}
}

// lostLog records the calls of a HoldWatcher's lost callback. Each call
// blocks until unblock is closed, so that stop can be checked not to wait
// for lost to return.
type lostLog struct {
	calls   chan lostCall
	n       atomic.Int32
	unblock chan struct{}
	once    sync.Once
}

type lostCall struct {
	at  time.Time
	err error
}

func newLostLog(block bool) *lostLog {
	l := &lostLog{calls: make(chan lostCall, 16), unblock: make(chan struct{})}
	if !block {
		l.release()
	}
	return l
}

func (l *lostLog) lost(err error) {
	l.n.Add(1)
	select {
	case l.calls <- lostCall{time.Now(), err}:
	default:
	}
	select {
	case <-l.unblock:
	case <-time.After(time.Minute): // never wedge the driver for good
	}
}

func (l *lostLog) release() { l.once.Do(func() { close(l.unblock) }) }

// A watched lock that its owner keeps (refreshing it, re-acquiring it,
// changing its TTL) and that other owners fail to take, refresh or release,
// for several TTLs, never gets lost called; nor does its owner's Release
// through the watching Locker. stop may be called twice, from two
// goroutines at once.
func (s *suite) driverHoldWatcher(t *testing.T) {
	a, b := s.open(t), s.open(t)
	w := a.(driver.HoldWatcher)
	key, ttl := newKey(t), ttlFor(a, s.medium())
	o := newOwner()
	g := s.acquire(t, a, key, o, ttl)
	log := newLostLog(false)
	stop, err := w.WatchHold(key, o, g.token, log.lost)
	if err != nil {
		t.Logf("WatchHold returned %v: the grant is not watched, so there is nothing to check", err)
		return
	}
	noAlarm := func(what string) {
		t.Helper()
		if n := log.n.Load(); n > 0 {
			c := <-log.calls
			t.Fatalf("lost called (%v) %s, while the lock was held: a false alarm", c.err, what)
		}
	}
	end := time.Now().Add(5 * ttl / 2)
	for i := 0; time.Now().Before(end); i++ {
		switch i % 3 {
		case 0:
			if err := a.Refresh(s.callCtx(t), key, o, ttl); err != nil {
				t.Fatalf("Refresh by the holder: %v", err)
			}
			noAlarm("after the owner's Refresh")
		case 1:
			if tok, err := a.Acquire(s.callCtx(t), key, o, ttl); err != nil || tok != g.token {
				t.Fatalf("repeated Acquire by the holder = (%d, %v), want (%d, nil)", tok, err, g.token)
			}
			noAlarm("after the owner's repeated Acquire")
		case 2:
			other := newOwner()
			_, err := b.Acquire(s.callCtx(t), key, other, ttl)
			wantErr(t, "Acquire by another owner", err, driver.ErrNotAcquired)
			wantErr(t, "Refresh by another owner", b.Refresh(s.callCtx(t), key, other, ttl), driver.ErrNotHeld)
			wantErr(t, "Release by another owner", b.Release(s.callCtx(t), key, other), driver.ErrNotHeld)
			noAlarm("after other owners' failed calls")
		}
		// Short enough that the owner's calls, one iteration in three, come
		// well within the TTL on a loaded machine (a server-side idle timer,
		// as PostgreSQL's, ends the lock otherwise).
		time.Sleep(ttl / 8)
	}
	if err := a.Refresh(s.callCtx(t), key, o, ttlFor(a, s.long())); err != nil {
		t.Fatalf("Refresh by the holder to a longer TTL: %v", err)
	}
	if err := a.Refresh(s.callCtx(t), key, o, ttl); err != nil {
		t.Fatalf("Refresh by the holder back to a shorter TTL: %v", err)
	}
	noAlarm("after the owner changed the TTL")
	if err := a.Release(s.callCtx(t), key, o); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
	time.Sleep(wakeBound / 2) // time for a watcher that misreads the release to call lost
	noAlarm("after the owner's Release")
	stopTwice(t, "stop called twice at once", stop)
}

// A watched lock whose owner lets it expire, and that another owner then
// takes, may be reported lost or not; if it is, lost is called only after
// the lock could have expired, with an error matching ErrNotHeld, once; and
// stop returns while lost is still running.
func (s *suite) driverHoldWatcherExpiry(t *testing.T) {
	a, b := s.open(t), s.open(t)
	w := a.(driver.HoldWatcher)
	key, ttl := newKey(t), ttlFor(a, s.unit)
	o := newOwner()
	g := s.acquire(t, a, key, o, ttl)
	log := newLostLog(true)
	defer log.release()
	stop, err := w.WatchHold(key, o, g.token, log.lost)
	if err != nil {
		t.Logf("WatchHold returned %v: the grant is not watched, so there is nothing to check", err)
		return
	}
	s.expectExpiry(t, b, expiry{g: g, what: "a watched lock"})
	select {
	case c := <-log.calls:
		notBefore(t, "lost was called", c.at, s.earliest(g))
		wantErr(t, "the error lost was called with", c.err, driver.ErrNotHeld)
		within(t, quick, "stop while lost is running", stop)
		log.release()
		time.Sleep(wakeBound / 2) // time for a second call
		if n := log.n.Load(); n != 1 {
			t.Fatalf("lost called %d times, want at most once", n)
		}
	case <-time.After(late(ttl) + wakeBound):
		t.Logf("the expiry and the takeover were not reported; the contract allows that")
		log.release()
		stop()
		if n := log.n.Load(); n > 1 {
			t.Fatalf("lost called %d times, want at most once", n)
		}
	}
}
