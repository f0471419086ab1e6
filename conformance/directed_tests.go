package conformance

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// directedSubtests returns the directed fault subtests (trace rows
// F7–F16): each stages one fault at the moment it matters, on its own short
// schedule, and checks one obligation. Each is registered when the Harness
// sets its hook and the driver has the interfaces it needs.
func (s *suite) directedSubtests() []subtest {
	var subs []subtest
	add := func(name string, set bool, fn func(t *testing.T)) {
		if set {
			subs = append(subs, subtest{name: name, fn: fn})
		}
	}
	inspect, watch := s.has["Inspector"], s.has["HoldWatcher"]
	add("LostReply", s.h.Cut != nil, s.testLostReply)
	add("RefreshUnderCut", s.h.Cut != nil, s.testRefreshUnderCut)
	add("RestartWhileCut", s.h.Cut != nil && s.h.RestartEmpty != nil, s.testRestartWhileCut)
	add("InspectAfterRestart", s.h.Restart != nil && inspect, s.testInspectAfterRestart)
	add("InspectAfterRestartEmpty", s.h.RestartEmpty != nil && inspect, s.testInspectAfterRestartEmpty)
	add("ServerAgrees", s.h.Reset != nil && inspect, s.testServerAgrees)
	add("WatchAcrossReset", s.h.Reset != nil && inspect && watch, s.testWatchAcrossReset)
	add("WatchRestartEmpty", s.h.RestartEmpty != nil && inspect && watch, s.testWatchRestartEmpty)
	add("ChangesAcrossReset", s.h.Reset != nil && s.has["ChangeWatcher"], s.testChangesAcrossReset)
	waiter := s.has["Waiter"]
	add("WaitAcrossReset", s.h.Reset != nil && waiter, func(t *testing.T) {
		s.testWaitAcross(t, "Reset", func(w driver.Locker) error { return s.h.Reset(w) })
	})
	add("WaitAcrossRestart", s.h.Restart != nil && waiter, func(t *testing.T) {
		s.testWaitAcross(t, "Restart", func(driver.Locker) error {
			s.restart(t, s.h.Restart, "Restart")
			return nil
		})
	})
	return subs
}

// lostReplyCtx is how long the Acquire of Faults/LostReply may take; the
// cut lasts lostReplyCut.
const (
	lostReplyCtx = 300 * time.Millisecond
	lostReplyCut = time.Second
)

// cleanupBound bounds how long after a heal package locker's clean-up of a
// lost reply has freed the key: its clean-up Release runs with a 5s
// timeout from when the Acquire failed, so it is still waiting when the
// cut ends.
func (s *suite) cleanupBound() time.Duration { return 5*time.Second + 2*s.unit }

// testLostReply is row F7: an Acquire whose reply is lost under a cut must
// not report ErrNotAcquired, and package locker's clean-up must free what
// the server may have granted well before its TTL.
func (s *suite) testLostReply(t *testing.T) {
	d, probe := s.open(t), s.open(t)
	l := locker.New(d)
	t.Cleanup(func() { _ = l.Close() })
	key := newKey(t)
	heal := s.cut(t, d)
	cutAt := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), lostReplyCtx)
	var lk *locker.Lock
	var err error
	within(t, lostReplyCtx+quick, "TryAcquire through a cut-off Locker with a 300ms context", func() {
		lk, err = l.TryAcquire(ctx, key, locker.WithTTL(s.hold()))
	})
	cancel()
	if errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a free key through a cut-off Locker reported %v: the key was free, so the reply was lost, "+
			"not refused; want the context's error (or success)", err)
	}
	time.Sleep(time.Until(cutAt.Add(lostReplyCut))) // the cut's schedule
	heal()
	healAt := time.Now()
	if err == nil {
		_ = lk.Release(s.callCtx(t))
	}
	bound := s.cleanupBound()
	for {
		o := newOwner()
		_, aerr := probe.Acquire(s.callCtx(t), key, o, ttlFor(probe, s.hold()))
		if aerr == nil {
			_ = probe.Release(s.callCtx(t), key, o)
			t.Logf("the key was free %v after the heal", fmtDur(time.Since(healAt)))
			return
		}
		if !errors.Is(aerr, driver.ErrNotAcquired) {
			t.Fatalf("Acquire by another Locker after the heal: %v", aerr)
		}
		if time.Since(healAt) > bound {
			t.Fatalf("the key is still held %v after the heal, with a TTL of %v: the grant whose reply was lost (%v) was not cleaned up",
				fmtDur(bound), s.hold(), err)
		}
		time.Sleep(max(s.unit/20, 5*time.Millisecond))
	}
}

// testRefreshUnderCut is row F15: a Refresh, with a shorter and with a
// longer TTL, through a Locker cut off from the server, returns before the
// heal with an error: no reply could come back, so success would be one
// it did not get. After the heal the holder still holds, unless its lock
// lived in the session the cut-short calls ended (Capabilities.LockerBound).
func (s *suite) testRefreshUnderCut(t *testing.T) {
	d := s.open(t)
	key, o := newKey(t), newOwner()
	s.acquire(t, d, key, o, s.hold())
	heal := s.cut(t, d)
	for _, ttl := range []time.Duration{s.medium(), 2 * s.hold()} {
		ctx, cancel := context.WithTimeout(context.Background(), lostReplyCtx)
		var rerr error
		within(t, lostReplyCtx+quick, "Refresh through a cut-off Locker with a 300ms context", func() {
			rerr = d.Refresh(ctx, key, o, ttlFor(d, ttl))
		})
		cancel()
		if rerr == nil {
			t.Fatalf("Refresh (ttl %v) through a Locker cut off from the server reported success, which no reply could have brought", ttl)
		}
	}
	heal()
	err := s.answer(t, "Refresh by the holder after the heal", func(ctx context.Context) error {
		return d.Refresh(ctx, key, o, ttlFor(d, s.hold()))
	})
	if errors.Is(err, driver.ErrNotHeld) && s.caps.LockerBound {
		// A session-bound lock may end with the connection a cut-short
		// call left unusable.
		t.Logf("Refresh after the heal: %v (the backend's locks live in sessions)", err)
		return
	}
	if err != nil {
		t.Fatalf("Refresh by the holder after the heal (its TTL of %v has not run out): %v", s.hold(), err)
	}
	_ = d.Release(s.callCtx(t), key, o)
}

// testInspectAfterRestart is row F8: after a restart that keeps the data,
// Inspect reports the same holder and token, and the holder still holds;
// where locks live in sessions (Capabilities.LockerBound), the lock may be
// gone, but then Inspect must not report it.
func (s *suite) testInspectAfterRestart(t *testing.T) {
	d, q, key, o, g, info, err := s.heldAcross(t, s.h.Restart, "Restart")
	if s.caps.LockerBound && (errors.Is(err, driver.ErrNotHeld) || (err == nil && info.Owner != o)) {
		s.agrees(t, q, key, info, err, "after Restart (the backend's locks live in sessions)")
		return
	}
	if err != nil || info.Owner != o || info.Token != g.token {
		t.Fatalf("Inspect after Restart: got %s, want owner %.8s token %d (the holder's, as before the restart)", fmtInfo(info, err), o, g.token)
	}
	rerr := s.answer(t, "Refresh by the holder after Restart", func(ctx context.Context) error {
		return d.Refresh(ctx, key, o, ttlFor(d, s.hold()))
	})
	if rerr != nil {
		t.Fatalf("Refresh by the holder after Restart, which Inspect reports as holding: %v", rerr)
	}
	_ = d.Release(s.callCtx(t), key, o)
}

// testInspectAfterRestartEmpty is row F9: after a restart that loses the
// data, Inspect reports no stale holder: what it reports agrees with
// whether another owner can take the key.
func (s *suite) testInspectAfterRestartEmpty(t *testing.T) {
	d, q, key, o, g, info, err := s.heldAcross(t, s.h.RestartEmpty, "RestartEmpty")
	s.agrees(t, q, key, info, err, "after RestartEmpty")
	if err == nil && (info.Owner != o || info.Token != g.token) {
		t.Fatalf("Inspect after RestartEmpty reports %s, a holder nobody was granted (want owner %.8s token %d, or none)", fmtInfo(info, nil), o, g.token)
	}
	_ = d.Release(s.callCtx(t), key, o)
}

// testServerAgrees is row F10: a Reset of a Locker that holds nothing (it
// held the key, released it, and another Locker took it) changes no key's
// holder once it has reconnected; and after a Reset of the holder, the
// server's holder is the one the holder believes in, or the holder learns
// it lost the key.
func (s *suite) testServerAgrees(t *testing.T) {
	b, c, q := s.open(t), s.open(t), s.open(t)
	key, ob, oc := newKey(t), newOwner(), newOwner()
	s.acquire(t, b, key, ob, s.hold())
	if err := b.Release(s.callCtx(t), key, ob); err != nil {
		t.Fatalf("Release by the holder: %v", err)
	}
	g := s.acquire(t, c, key, oc, s.hold())
	if err := s.h.Reset(b); err != nil {
		t.Fatalf("fault hook Reset failed: %v", err)
	}
	// A round trip through b, so that it has reconnected.
	other, oo := newKey(t), newOwner()
	if err := s.answer(t, "Acquire through the reset Locker", func(ctx context.Context) error {
		_, err := b.Acquire(ctx, other, oo, ttlFor(b, s.hold()))
		return err
	}); err != nil {
		t.Fatalf("Acquire of a free key through the reset Locker: %v", err)
	}
	_ = b.Release(s.callCtx(t), other, oo)
	info, err := s.inspectAnswer(t, q, key)
	if err != nil || info.Owner != oc || info.Token != g.token {
		t.Fatalf("after a Reset of a Locker that holds nothing (it released the key before another took it), Inspect reports %s; "+
			"want the holder's owner %.8s token %d, unchanged", fmtInfo(info, err), oc, g.token)
	}
	// Now the holder's own connections.
	start := time.Now()
	if err := s.h.Reset(c); err != nil {
		t.Fatalf("fault hook Reset failed: %v", err)
	}
	rerr := s.answer(t, "Refresh by the holder after its Reset", func(ctx context.Context) error {
		return c.Refresh(ctx, key, oc, ttlFor(c, s.hold()))
	})
	info, err = s.inspectAnswer(t, q, key)
	switch {
	case rerr == nil && (err != nil || info.Owner != oc || info.Token != g.token):
		t.Fatalf("after a Reset of the holder, its Refresh succeeded (it believes it holds), but Inspect reports %s, want owner %.8s token %d",
			fmtInfo(info, err), oc, g.token)
	case rerr != nil && !errors.Is(rerr, driver.ErrNotHeld):
		t.Fatalf("Refresh by the holder after its Reset: %v", rerr)
	case rerr != nil && err == nil && info.Owner == oc:
		// The session-bound lock ends once the server notices the reset
		// connection; the holder heard first, which is the safe order.
		bound := s.h.LostBound["Reset"] + time.Second
		for err == nil && info.Owner == oc {
			if time.Since(start) > bound {
				t.Fatalf("after a Reset of the holder, its Refresh reported %v, but Inspect still reports it as holder (%s) %v after the reset",
					rerr, fmtInfo(info, nil), fmtDur(bound))
			}
			time.Sleep(5 * time.Millisecond) // waiting for the server to notice is the point
			info, err = s.inspectAnswer(t, q, key)
		}
	}
	_ = c.Release(s.callCtx(t), key, oc)
}

// watchWindow is how long Faults/WatchAcrossReset watches for a false
// alarm after the holder has reconnected, and how soon after RestartEmpty
// returns Faults/WatchRestartEmpty wants the loss reported.
const watchWindow = time.Second

// testWatchAcrossReset is row F11: a HoldWatcher whose connection is reset
// while the server keeps the lock reports no loss.
func (s *suite) testWatchAcrossReset(t *testing.T) {
	d, q, key, o, g, lost := s.watched(t)
	if lost == nil {
		return
	}
	if err := s.h.Reset(d); err != nil {
		t.Fatalf("fault hook Reset failed: %v", err)
	}
	rerr := s.answer(t, "Refresh by the holder after its Reset", func(ctx context.Context) error {
		return d.Refresh(ctx, key, o, ttlFor(d, s.hold()))
	})
	if rerr != nil && !errors.Is(rerr, driver.ErrNotHeld) {
		t.Fatalf("Refresh by the holder after its Reset: %v", rerr)
	}
	var lerr error
	select {
	case lerr = <-lost:
	case <-time.After(watchWindow):
		_ = d.Release(s.callCtx(t), key, o)
		return
	}
	info, err := s.inspectAnswer(t, q, key)
	if err == nil && info.Owner == o && info.Token == g.token {
		t.Fatalf("after a Reset of the holder's connections, its HoldWatcher reported the lock lost (%v), "+
			"but the server still holds it (Inspect: %s): a false alarm", lerr, fmtInfo(info, nil))
	}
}

// testWatchRestartEmpty is row F12: after a restart that loses the lock,
// the HoldWatcher reports the loss within watchWindow of the restart; where
// the lock survives (a quorum of servers), it reports nothing.
func (s *suite) testWatchRestartEmpty(t *testing.T) {
	d, q, key, o, g, lost := s.watched(t)
	if lost == nil {
		return
	}
	s.restart(t, s.h.RestartEmpty, "RestartEmpty")
	back := time.Now()
	info, err := s.inspectAnswer(t, q, key)
	held := err == nil && info.Owner == o && info.Token == g.token
	timer := time.NewTimer(time.Until(back.Add(watchWindow)))
	defer timer.Stop()
	select {
	case lerr := <-lost:
		if held {
			t.Fatalf("after RestartEmpty the server still holds the lock (Inspect: %s), but the HoldWatcher reported it lost: %v", fmtInfo(info, nil), lerr)
		}
		t.Logf("the HoldWatcher reported the loss %v after RestartEmpty returned", fmtDur(time.Since(back)))
	case <-timer.C:
		if !held {
			t.Fatalf("RestartEmpty lost the lock (Inspect: %s), but the HoldWatcher had not reported it %v after the restart returned",
				fmtInfo(info, err), watchWindow)
		}
		_ = d.Release(s.callCtx(t), key, o)
	}
}

// testWaitAcross is row F13: a Waiter subscribed under a long-TTL holder,
// whose connection a fault breaks (fault: Reset of the waiter's Locker, or
// Restart), is woken by the holder's release within wakeBound, not at the
// holder's TTL, and the key is then free to the waiter. Wake-ups before
// the release are allowed (a driver sends one after a lost connection) and
// drained. Since that one wake-up may come late and pass for the
// release's, the key is taken again, must stay quiet (no wake-up in one of
// three 300ms windows: a polling Waiter cannot show it heard a release),
// and a second release must wake the waiter too.
func (s *suite) testWaitAcross(t *testing.T, name string, fault func(w driver.Locker) error) {
	h, w := s.open(t), s.open(t)
	key, o := newKey(t), newOwner()
	s.acquire(t, h, key, o, s.hold())
	wake, cancel, err := w.(driver.Waiter).Subscribe(s.callCtx(t), key)
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer cancel()
	if err := fault(w); err != nil {
		t.Fatalf("fault hook %s failed: %v", name, err)
	}
	// A round trip through the waiter's Locker, so that it has reconnected,
	// and through the holder's, which must still hold.
	if err := s.answer(t, "Acquire through the waiter's Locker after "+name, func(ctx context.Context) error {
		_, err := w.Acquire(ctx, key, newOwner(), ttlFor(w, s.hold()))
		return err
	}); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire of the held key through the waiter's Locker after %s: got %v, want ErrNotAcquired", name, err)
	}
	if err := s.answer(t, "Refresh by the holder after "+name, func(ctx context.Context) error {
		return h.Refresh(ctx, key, o, ttlFor(h, s.hold()))
	}); err != nil {
		t.Fatalf("Refresh by the holder after %s: %v", name, err)
	}
	drainWake(wake)
	s.wokenByRelease(t, h, w, wake, key, o, name, "")
	// The wake-up above may be the one a driver sends after a lost
	// connection, come late (a deaf waiter whose reconnect was slow): a
	// second release, once the key has stayed quiet, must wake it too.
	o2 := newOwner()
	if err := s.answer(t, "Acquire by the holder's Locker again", func(ctx context.Context) error {
		_, err := h.Acquire(ctx, key, o2, ttlFor(h, s.hold()))
		return err
	}); err != nil {
		t.Fatalf("Acquire of the free key by the holder's Locker again: %v", err)
	}
	s.quietWhileHeld(t, wake, name)
	s.wokenByRelease(t, h, w, wake, key, o2, name, "a second time, ")
}

// waitQuiet is how long Faults/WaitAcross* wants the Waiter silent while
// the key is held and nobody touches it, and waitQuietTries how many such
// windows it tries before it calls the Waiter a poller.
const (
	waitQuiet      = 300 * time.Millisecond
	waitQuietTries = 3
)

// quietWhileHeld fails if the Waiter wakes in each of waitQuietTries
// windows of waitQuiet while the key is held and unchanged: its wake-ups
// are a timer's, and cannot show that a release woke it.
func (s *suite) quietWhileHeld(t *testing.T, wake <-chan struct{}, name string) {
	t.Helper()
	for range waitQuietTries {
		drainWake(wake)
		select {
		case <-wake:
		case <-time.After(waitQuiet):
			return
		}
	}
	t.Fatalf("after %s, the Waiter woke in each of %d windows of %v while the key was held and unchanged: "+
		"it polls, so a wake-up after the release cannot show the release was heard", name, waitQuietTries, waitQuiet)
}

// wokenByRelease releases key for owner o through h and checks that the
// Waiter wakes within wakeBound, and that the key is then free to the
// waiter's Locker w.
func (s *suite) wokenByRelease(t *testing.T, h, w driver.Locker, wake <-chan struct{}, key, o, name, again string) {
	t.Helper()
	released := time.Now()
	if err := s.answer(t, "Release by the holder", func(ctx context.Context) error {
		return h.Release(ctx, key, o)
	}); err != nil && !errors.Is(err, driver.ErrNotHeld) { // ErrNotHeld: an attempt whose reply was lost released it
		t.Fatalf("Release by the holder: %v", err)
	}
	select {
	case <-wake:
		t.Logf("woken %s%v after the release", again, fmtDur(time.Since(released)))
	case <-time.After(wakeBound):
		t.Fatalf("the Waiter subscribed before %s was not woken %swithin %v of the holder's release (the holder's TTL is %v)",
			name, again, wakeBound, s.hold())
	}
	ow := newOwner()
	if err := s.answer(t, "Acquire through the woken waiter's Locker", func(ctx context.Context) error {
		_, err := w.Acquire(ctx, key, ow, ttlFor(w, s.hold()))
		return err
	}); err != nil {
		t.Fatalf("Acquire through the woken waiter's Locker after the release: %v", err)
	}
	if err := s.answer(t, "Release by the waiter", func(ctx context.Context) error {
		return w.Release(ctx, key, ow)
	}); err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release by the waiter: %v", err)
	}
}

// testRestartWhileCut is row F16: a holder cut off while the server
// restarts without its data, and another owner takes the key, learns on
// its first round trip after the heal that it no longer holds it: it does
// not re-assert the lock it believed in. Where the lock survives the
// restart (a quorum of servers), the holder still holds it.
func (s *suite) testRestartWhileCut(t *testing.T) {
	d, q := s.open(t), s.open(t)
	key, o, oq := newKey(t), newOwner(), newOwner()
	g := s.acquire(t, d, key, o, s.hold())
	heal := s.cut(t, d)
	s.restart(t, s.h.RestartEmpty, "RestartEmpty")
	var tq uint64
	qerr := s.answer(t, "Acquire by another owner after RestartEmpty", func(ctx context.Context) error {
		var err error
		tq, err = q.Acquire(ctx, key, oq, ttlFor(q, s.hold()))
		return err
	})
	heal()
	rerr := s.answer(t, "Refresh by the holder after the heal", func(ctx context.Context) error {
		return d.Refresh(ctx, key, o, ttlFor(d, s.hold()))
	})
	switch {
	case errors.Is(qerr, driver.ErrNotAcquired):
		// The lock survived the restart.
		if rerr != nil {
			t.Fatalf("the holder's lock survived RestartEmpty (another owner could not take it), but its Refresh after the heal failed: %v", rerr)
		}
		_ = d.Release(s.callCtx(t), key, o)
		return
	case qerr != nil:
		t.Fatalf("Acquire by another owner after RestartEmpty: %v", qerr)
	case rerr == nil:
		t.Fatalf("another owner took the key (token %d) after RestartEmpty lost the holder's lock (token %d), "+
			"but the holder's Refresh after the heal succeeded", tq, g.token)
	case !errors.Is(rerr, driver.ErrNotHeld):
		t.Fatalf("Refresh by the former holder after the heal: %v", rerr)
	}
	// The new holder may first meet a connection the restart broke: what
	// counts is its first answer from the server.
	if err := s.answer(t, "Refresh by the new holder after the former holder reconnected", func(ctx context.Context) error {
		return q.Refresh(ctx, key, oq, ttlFor(q, s.hold()))
	}); err != nil {
		t.Fatalf("Refresh by the new holder after the former holder reconnected: %v", err)
	}
	_ = q.Release(s.callCtx(t), key, oq)
}
