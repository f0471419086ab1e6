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
	"github.com/go-locker/locker/driver"
)

// changeBound bounds how long after a grant or a release through another
// Locker a driver.ChangeWatcher may take to report it: a notification
// takes a round trip, so 1s (wakeBound) on a loaded machine, plus one unit
// for a backend whose server is slow to act (its unit is its MinTTL).
// It stays under a grant's shortest TTL in these checks, none of which
// waits for a lock to run out before the report it expects.
func (s *suite) changeBound() time.Duration { return wakeBound + s.unit }

// changeLog records the calls of a ChangeWatcher's changed callback: when
// each began, whether two ever ran at once, and, while block is set, holds
// each call until unblock (so that stop can be checked not to wait for it).
type changeLog struct {
	mu      sync.Mutex
	at      []time.Time
	sig     chan struct{} // a value after each call; buffered
	busy    atomic.Int32
	overlap atomic.Bool
	block   atomic.Bool
	entered chan struct{} // a value when a blocked call starts waiting
	unblock chan struct{}
	once    sync.Once
}

func newChangeLog() *changeLog {
	return &changeLog{sig: make(chan struct{}, 1), entered: make(chan struct{}, 1), unblock: make(chan struct{})}
}

func (c *changeLog) changed() {
	if c.busy.Add(1) > 1 {
		c.overlap.Store(true)
	}
	defer c.busy.Add(-1)
	c.mu.Lock()
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
	select {
	case c.sig <- struct{}{}:
	default:
	}
	if c.block.Load() {
		select {
		case c.entered <- struct{}{}:
		default:
		}
		select {
		case <-c.unblock:
		case <-time.After(time.Minute): // never wedge the driver for good
		}
	}
}

func (c *changeLog) release() { c.once.Do(func() { close(c.unblock) }) }

// latest returns when the last call began.
func (c *changeLog) latest() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.at) == 0 {
		return time.Time{}
	}
	return c.at[len(c.at)-1]
}

// since returns how many calls began at or after t.
func (c *changeLog) since(t time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, at := range c.at {
		if !at.Before(t) {
			n++
		}
	}
	return n
}

// keyState is what a read of the key must find for a change to count as
// seen: held by owner with token, or free (owner "").
type keyState struct {
	owner string
	token uint64
}

func (k keyState) String() string {
	if k.owner == "" {
		return "free"
	}
	return fmt.Sprintf("held by owner %.8s with token %d", k.owner, k.token)
}

// readState reads key through in and reports whether it is in state want,
// and what it found.
func (s *suite) readState(t *testing.T, in driver.Inspector, key string, want keyState) (bool, string) {
	t.Helper()
	info, err := in.Inspect(s.callCtx(t), key)
	switch {
	case errors.Is(err, driver.ErrNotHeld):
		return want.owner == "", "free"
	case err != nil:
		t.Fatalf("Inspect(%q) after a change report: %v", key, err)
	}
	got := keyState{info.Owner, info.Token}
	return got == want, got.String()
}

// expectChange waits for a report of a change made through another Locker
// (its call was sent at sent) after which a read through in finds want.
// Reports are not matched to changes: each report that began at or after
// sent is followed by a read, and a read that finds an older state (a
// report of an earlier change, or a spurious one) only means waiting on.
// It fails if none comes within changeBound of the change's return, and
// otherwise returns how long after the change was sent the report that
// was followed by such a read began.
func (s *suite) expectChange(t *testing.T, c *changeLog, in driver.Inspector, key, what string, sent, ret time.Time, want keyState) time.Duration {
	t.Helper()
	deadline := time.NewTimer(time.Until(ret.Add(s.changeBound())))
	defer deadline.Stop()
	found := "nothing (no report since the change)"
	for {
		select {
		case <-c.sig:
			if c.since(sent) == 0 {
				continue
			}
			at := c.latest()
			ok, got := s.readState(t, in, key, want)
			if ok {
				return at.Sub(sent)
			}
			found = got
		case <-deadline.C:
			if c.since(sent) > 0 {
				at := c.latest()
				if ok, _ := s.readState(t, in, key, want); ok {
					return at.Sub(sent) // the last report's signal was taken by an earlier wait
				}
			}
			t.Fatalf("%s was not reported: %d reports within %v of the change (%s), none followed by a read that finds it; "+
				"the last such read found %s", what, c.since(sent), s.changeBound(), want, found)
		}
	}
}

// changeWatch starts a watch of key through w, failing the test on an
// error.
func changeWatch(t *testing.T, cw driver.ChangeWatcher, ctx context.Context, key string, c *changeLog) func() {
	t.Helper()
	stop, err := cw.WatchChanges(ctx, key, c.changed)
	if err != nil {
		t.Fatalf("WatchChanges(%q): %v", key, err)
	}
	t.Cleanup(stop)
	return stop
}

// changeSetup is a watch of an election key through w, whose changes the
// checks make through a and read through r.
type changeSetup struct {
	a, w, r driver.Locker
	cw      driver.ChangeWatcher
	in      driver.Inspector
	key     string
	c       *changeLog
}

// startChanges opens three Lockers and watches a fresh election key
// through the second until the test ends; nil (logged) if the driver
// refuses with an error matching errors.ErrUnsupported, which leaves
// nothing to check.
func (s *suite) startChanges(t *testing.T) *changeSetup {
	t.Helper()
	cs := &changeSetup{a: s.open(t), w: s.open(t), r: s.open(t), key: electionKey(t), c: newChangeLog()}
	cs.cw, cs.in = cs.w.(driver.ChangeWatcher), cs.r.(driver.Inspector)
	stop, err := cs.cw.WatchChanges(s.callCtx(t), cs.key, cs.c.changed)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Logf("WatchChanges of an election key refused (%v): nothing to check", err)
		return nil
	} else if err != nil {
		t.Fatalf("WatchChanges(%q) on a reachable backend: %v, want nil or an error matching errors.ErrUnsupported", cs.key, err)
	}
	t.Cleanup(stop)
	return cs
}

// stopTwice calls stop from two goroutines at once and fails the test if
// either panics or they do not return within quick.
func stopTwice(t *testing.T, what string, stop func()) {
	t.Helper()
	var wg sync.WaitGroup
	panics := make(chan any, 2)
	for range 2 {
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					panics <- r
				}
			}()
			stop()
		})
	}
	within(t, quick, what, wg.Wait)
	close(panics)
	for r := range panics {
		t.Fatalf("stop called twice, from two goroutines at once: panic: %v", r)
	}
}

// electionKey is a fresh key under locker.ElectionPrefix, which every
// ChangeWatcher watches (PostgreSQL lease mode announces only those).
func electionKey(t *testing.T) string { return locker.ElectionPrefix + newKey(t) }

// A ChangeWatcher reports, on an election's key, a grant made through
// another Locker right after WatchChanges returned, a release, a grant of
// the freed key, and a takeover of an expired lock, each within
// changeBound, never two calls at once; stop ends the watch; bad input, a
// done context and a closed Locker fail as the contract says. A refusal
// (the deployment cannot notify) must match errors.ErrUnsupported.
func (s *suite) driverChangeWatcher(t *testing.T) {
	cs := s.startChanges(t)
	if cs == nil {
		return
	}
	a, r, cw, in, key, c := cs.a, cs.r, cs.cw, cs.in, cs.key, cs.c
	s.changeSequence(t, a, r, in, key, c)
	if c.overlap.Load() {
		t.Fatal("changed was called while an earlier call was still running: it must never run concurrently with itself")
	}
	s.changeStop(t, a, cw, in)
	s.changeErrors(t, cw)
	s.changePlainKey(t, a, cw, in)
}

// changeSequence makes the changes a watch of key must report: each is a
// raw call through a (b for the takeover), then a wait for its report.
func (s *suite) changeSequence(t *testing.T, a, b driver.Locker, in driver.Inspector, key string, c *changeLog) {
	t.Helper()
	var lags []string
	defer func() { t.Logf("change-watch: report lag after the change was sent: %v", lags) }()
	step := func(what string, d driver.Locker, owner string, ttl time.Duration, release bool) grant {
		t.Helper()
		sent := time.Now()
		if release {
			if err := d.Release(s.callCtx(t), key, owner); err != nil {
				t.Fatalf("%s: Release: %v", what, err)
			}
			lags = append(lags, fmtDur(s.expectChange(t, c, in, key, what, sent, time.Now(), keyState{})))
			return grant{}
		}
		g := s.acquire(t, d, key, owner, ttl)
		lags = append(lags, fmtDur(s.expectChange(t, c, in, key, what, sent, g.returned, keyState{owner, g.token})))
		return g
	}
	o1, o2, o3, o4 := newOwner(), newOwner(), newOwner(), newOwner()
	step("a grant made right after WatchChanges returned", a, o1, ttlFor(a, s.hold()), false)
	step("a release", a, o1, 0, true)
	step("a grant of the released key", a, o2, ttlFor(a, s.hold()), false)
	step("a second release", a, o2, 0, true)
	g := step("a grant with a TTL of one unit", a, o3, ttlFor(a, s.unit), false)
	// The expiry need not be reported by itself; the takeover must be.
	s.waitExpired(t, b, g)
	step("a takeover of the expired lock by another owner, through another Locker", b, o4, ttlFor(b, s.hold()), false)
	step("the new owner's release", b, o4, 0, true)
}

// changeStop checks stop: it returns while changed is running, may be
// called twice at once, and ends the watch: after it returns, changed is
// called at most once more (the call in flight), whatever changes follow.
// A second watch of the same key through the same Locker is the barrier:
// once it has reported a change, the stopped watch would have too.
func (s *suite) changeStop(t *testing.T, a driver.Locker, cw driver.ChangeWatcher, in driver.Inspector) {
	t.Helper()
	key, stopped, barrier := electionKey(t), newChangeLog(), newChangeLog()
	stop := changeWatch(t, cw, s.callCtx(t), key, stopped)
	changeWatch(t, cw, s.callCtx(t), key, barrier)
	stopped.block.Store(true)
	defer stopped.release()
	o := newOwner()
	sent := time.Now()
	g := s.acquire(t, a, key, o, ttlFor(a, s.hold()))
	select {
	case <-stopped.entered:
	case <-time.After(s.changeBound()):
		t.Fatalf("the grant was not reported within %v on the watch to be stopped", s.changeBound())
	}
	stopTwice(t, "stop called twice at once while changed is running", stop)
	stoppedAt := time.Now()
	stopped.block.Store(false)
	stopped.release()
	s.expectChange(t, barrier, in, key, "a grant (on the barrier watch)", sent, time.Now(), keyState{o, g.token})
	for i := range 4 {
		sent := time.Now()
		want := keyState{}
		if i%2 == 0 {
			if err := a.Release(s.callCtx(t), key, o); err != nil {
				t.Fatalf("Release after stop: %v", err)
			}
		} else {
			o = newOwner()
			want = keyState{o, s.acquire(t, a, key, o, ttlFor(a, s.hold())).token}
		}
		s.expectChange(t, barrier, in, key, fmt.Sprintf("change %d after stop (on the barrier watch)", i+1), sent, time.Now(), want)
		// Time for a call that should not come, so that a watch that
		// goes on is seen once per change, not once for all four.
		time.Sleep(s.changeBound() / 10)
	}
	if n := stopped.since(stoppedAt); n > 1 {
		t.Fatalf("changed was called %d times after stop returned, for 4 changes made after it: want at most once (a call in flight)", n)
	}
	_ = a.Release(s.callCtx(t), key, o)
}

// changeErrors checks the calls that must fail: an empty key with
// ErrInvalid, a done context with its error, a closed Locker with
// ErrClosed; none calls changed.
func (s *suite) changeErrors(t *testing.T, cw driver.ChangeWatcher) {
	t.Helper()
	c := newChangeLog()
	try := func(what string, ctx context.Context, d driver.ChangeWatcher, key string, want error) {
		t.Helper()
		var stop func()
		var err error
		within(t, quick, "WatchChanges "+what, func() { stop, err = d.WatchChanges(ctx, key, c.changed) })
		if err == nil {
			stop()
			t.Fatalf("WatchChanges %s succeeded, want an error matching %v", what, want)
		}
		wantErr(t, "WatchChanges "+what, err, want)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	try("of an empty key", s.callCtx(t), cw, "", driver.ErrInvalid)
	try("with a cancelled context", cancelled, cw, electionKey(t), context.Canceled)
	try("with an expired context", ctxT(t, -time.Second), cw, electionKey(t), context.DeadlineExceeded)
	closed := s.open(t)
	if err := closed.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	try("after Close", s.callCtx(t), closed.(driver.ChangeWatcher), electionKey(t), driver.ErrClosed)
	time.Sleep(wakeBound / 4) // time for a call that should not come
	if n := c.since(time.Time{}); n > 0 {
		t.Fatalf("changed was called %d times by WatchChanges calls that failed", n)
	}
}

// changePlainKey checks a key outside locker.ElectionPrefix: a watch of it
// reports a grant, or is refused with an error matching
// errors.ErrUnsupported (PostgreSQL lease mode announces election keys
// only).
func (s *suite) changePlainKey(t *testing.T, a driver.Locker, cw driver.ChangeWatcher, in driver.Inspector) {
	t.Helper()
	key, c := newKey(t), newChangeLog()
	stop, err := cw.WatchChanges(s.callCtx(t), key, c.changed)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Logf("WatchChanges of a key outside locker.ElectionPrefix refused: %v", err)
		return
	} else if err != nil {
		t.Fatalf("WatchChanges of a key outside locker.ElectionPrefix: %v, want nil or an error matching errors.ErrUnsupported", err)
	}
	defer stop()
	o, sent := newOwner(), time.Now()
	g := s.acquire(t, a, key, o, ttlFor(a, s.hold()))
	s.expectChange(t, c, in, key, "a grant of a key outside locker.ElectionPrefix", sent, g.returned, keyState{o, g.token})
	_ = a.Release(s.callCtx(t), key, o)
}

// testChangesAcrossReset is row CW11: a watch whose Locker's connections are
// reset reports a release made right after the reset (while it
// reconnects), and then a grant.
func (s *suite) testChangesAcrossReset(t *testing.T) {
	cs := s.startChanges(t)
	if cs == nil {
		return
	}
	a, w, in, key, c := cs.a, cs.w, cs.in, cs.key, cs.c
	o, sent := newOwner(), time.Now()
	g := s.acquire(t, a, key, o, ttlFor(a, s.hold()))
	s.expectChange(t, c, in, key, "a grant before the Reset", sent, g.returned, keyState{o, g.token})
	if err := s.h.Reset(w); err != nil {
		t.Fatalf("fault hook Reset failed: %v", err)
	}
	sent = time.Now()
	if err := a.Release(s.callCtx(t), key, o); err != nil {
		t.Fatalf("Release right after the watcher's Reset: %v", err)
	}
	// The watcher's Locker answers once it has reconnected; the report may
	// come before or after, within changeBound of that answer.
	if _, err := s.answerInspect(t, w, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect through the watcher's Locker after the Reset: %v, want ErrNotHeld", err)
	}
	s.expectChange(t, c, in, key, "a release made right after the watcher's Reset", sent, time.Now(), keyState{})
	o, sent = newOwner(), time.Now()
	g = s.acquire(t, a, key, o, ttlFor(a, s.hold()))
	s.expectChange(t, c, in, key, "a grant after the watcher reconnected", sent, g.returned, keyState{o, g.token})
	_ = a.Release(s.callCtx(t), key, o)
}

// answerInspect is Inspect of key through d, retried until the backend
// answers (see answer).
func (s *suite) answerInspect(t *testing.T, d driver.Locker, key string) (driver.Info, error) {
	t.Helper()
	var info driver.Info
	err := s.answer(t, "Inspect through the reset Locker", func(ctx context.Context) error {
		var err error
		info, err = d.(driver.Inspector).Inspect(ctx, key)
		return err
	})
	return info, err
}
