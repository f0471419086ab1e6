package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// concurrency is how many subtests run at once. Most of them spend their
// time waiting for a TTL to run out, so running them side by side is what
// keeps the suite short on backends with long minimum TTLs (etcd: 2s).
const concurrency = 8

// Run runs the suite against the backend h opens. It fails t on any
// violation; it never passes a driver that breaks a guarantee it checks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		if h.hasFaults() {
			t.Fatal("conformance: Harness has fault hooks but no Open: the fault subtests need Open to make the Lockers they fault")
		}
		t.Fatal("conformance: Harness.Open is nil")
	}
	if spec := os.Getenv(childEnv); spec != "" {
		runChild(t, h, spec)
		return
	}
	s := &suite{h: h, unit: max(h.MinTTL, 100*time.Millisecond), sem: make(chan struct{}, concurrency), top: t.Name()}
	s.probe(t)
	driverSubs := append(s.driverSubtests(), s.sharedSubtests()...)
	lockerSubs := slices.Concat(s.lockerSubtests(), s.sharedLockerSubtests(), s.electionSubtests())
	faults := append(s.faultSubtests(), s.directedSubtests()...)
	s.checkCannot(t, map[string][]subtest{"Driver": driverSubs, "Locker": lockerSubs, "Faults": faults})
	t.Run("Driver", func(t *testing.T) { s.runAll(t, s.can(t, "Driver", driverSubs)) })
	t.Run("Locker", func(t *testing.T) { s.runAll(t, s.can(t, "Locker", lockerSubs)) })
	if faults = s.can(t, "Faults", faults); len(faults) > 0 {
		// One at a time: a fault may touch the whole server.
		t.Run("Faults", func(t *testing.T) {
			for _, st := range faults {
				s.runLimit(t, st.name, st.fn, s.faultTime(t)+2*time.Minute+30*s.unit)
			}
		})
	}
}

// checkCannot fails the test if Harness.Cannot names no subtest of groups.
func (s *suite) checkCannot(t *testing.T, groups map[string][]subtest) {
	t.Helper()
	for name := range s.h.Cannot {
		group, sub, _ := strings.Cut(name, "/")
		if !slices.ContainsFunc(groups[group], func(st subtest) bool { return st.name == sub }) {
			t.Fatalf("conformance: Harness.Cannot names %q, which is not a subtest of this driver's run", name)
		}
	}
}

// can returns subs without those Harness.Cannot declares, logging each of
// those with its reason.
func (s *suite) can(t *testing.T, group string, subs []subtest) []subtest {
	t.Helper()
	return slices.DeleteFunc(slices.Clone(subs), func(st subtest) bool {
		why, ok := s.h.Cannot[group+"/"+st.name]
		if ok {
			t.Logf("conformance: %s/%s is not run: the Harness declares the backend cannot meet it: %s", group, st.name, why)
		}
		return ok
	})
}

type suite struct {
	h    Harness
	unit time.Duration // the TTL most subtests use
	caps driver.Capabilities
	// has names the optional interfaces the driver implements, and
	// "HeldError" when its Acquire of a held key reports the holder's
	// remaining TTL.
	has map[string]bool
	sem chan struct{}
	top string // the name of the test that called Run, for Pause's child
}

type subtest struct {
	name string
	fn   func(t *testing.T)
	// needs names what the subtest checks beyond driver.Locker (see
	// suite.has; "A|B" for either); it is not run when the driver lacks it.
	needs string
}

// probe learns which optional interfaces the driver has, and its
// capabilities.
func (s *suite) probe(t *testing.T) {
	t.Helper()
	d := s.open(t)
	_, waiter := d.(driver.Waiter)
	_, blocking := d.(driver.BlockingAcquirer)
	_, inspector := d.(driver.Inspector)
	_, watcher := d.(driver.HoldWatcher)
	_, pinger := d.(driver.Pinger)
	_, shared := d.(driver.SharedLocker)
	_, batch := d.(driver.BatchRefresher)
	_, changes := d.(driver.ChangeWatcher)
	var refused error
	if r, ok := d.(driver.SharedRefuser); ok && shared {
		refused = r.SharedUnsupported() // refused by its configuration (Redis Redlock)
		shared = refused == nil
	}
	s.has = map[string]bool{"Waiter": waiter, "BlockingAcquirer": blocking, "Inspector": inspector,
		"HoldWatcher": watcher, "Pinger": pinger, "SharedLocker": shared, "BatchRefresher": batch,
		"ChangeWatcher": changes && inspector} // its checks read the holder with Inspect
	if c, ok := d.(driver.Capable); ok {
		s.caps = c.Capabilities()
	}
	// Does Acquire report the holder's remaining TTL? A failure here is
	// left to the subtests to report.
	ctx := ctxT(t, 10*time.Second+5*s.unit)
	key, o := newKey(t), newOwner()
	if _, err := d.Acquire(ctx, key, o, ttlFor(d, 10*s.unit)); err == nil {
		_, err := d.Acquire(ctx, key, newOwner(), ttlFor(d, 10*s.unit))
		var held *driver.HeldError
		s.has["HeldError"] = errors.As(err, &held) && held.Remaining > 0
		_ = d.Release(ctx, key, o)
	}
	var missing []string
	for _, name := range []string{"Waiter", "BlockingAcquirer", "Inspector", "HoldWatcher", "Pinger", "BatchRefresher", "SharedLocker", "ChangeWatcher"} {
		if !s.has[name] && (name != "SharedLocker" || refused == nil) {
			missing = append(missing, "driver."+name)
		}
	}
	if refused != nil {
		t.Logf("conformance: %T refuses shared holds (%v); their subtests are not run", d, refused)
	}
	if len(missing) > 0 {
		t.Logf("conformance: %T does not implement %s; their subtests are not run", d, strings.Join(missing, ", "))
	}
	if changes && !inspector {
		t.Logf("conformance: %T is a driver.ChangeWatcher but no driver.Inspector; Driver/ChangeWatcher reads the holder with Inspect, and is not run", d)
	}
	if !s.has["HeldError"] {
		t.Logf("conformance: %T does not return a *driver.HeldError with the holder's remaining TTL; Driver/HeldError is not run", d)
	}
	if !waiter && !blocking {
		t.Logf("conformance: %T has neither driver.Waiter nor driver.BlockingAcquirer: "+
			"package locker waits for it by polling, and Locker/WokenByRelease is not run", d)
	}
	_ = d.Close()
}

// hasAny reports whether the driver has any of the "|"-separated names in
// needs (see suite.has); an empty needs is always met.
func (s *suite) hasAny(needs string) bool {
	if needs == "" {
		return true
	}
	for name := range strings.SplitSeq(needs, "|") {
		if s.has[name] {
			return true
		}
	}
	return false
}

// runAll runs the subtests side by side, at most concurrency at a time, in
// the order given (the CPU-heavy ones first), and returns when all are done.
// testing.T.Run may be called from several goroutines at once.
func (s *suite) runAll(t *testing.T, subs []subtest) {
	var wg sync.WaitGroup
	for _, st := range subs {
		if !s.hasAny(st.needs) {
			continue
		}
		s.sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-s.sem }()
			s.run(t, st.name, st.fn)
		})
	}
	wg.Wait()
}

// run runs one subtest under a watchdog, and turns a panic in it (a driver
// that panics) into a failure of that subtest.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	s.runLimit(t, name, fn, 60*time.Second+30*s.unit)
}

func (s *suite) runLimit(t *testing.T, name string, fn func(t *testing.T), limit time.Duration) {
	t.Run(name, func(t *testing.T) {
		done := make(chan struct{})
		defer close(done)
		full := t.Name()
		timer := time.AfterFunc(limit, func() {
			select {
			case <-done:
			default:
				panic(fmt.Sprintf("conformance: watchdog: %s still running after %v; "+
					"the driver probably ignores a context, never expires a lock or never wakes a waiter", full, limit))
			}
		})
		defer timer.Stop()
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v\n%s", r, debug.Stack())
			}
		}()
		fn(t)
	})
}

// open returns a fresh driver.Locker, closed when the test ends.
func (s *suite) open(t *testing.T) driver.Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := s.h.Open(ctx)
	if err != nil {
		t.Fatalf("Harness.Open: %v", err)
	}
	if d == nil {
		t.Fatal("Harness.Open returned a nil driver.Locker")
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// locker returns a locker.Locker over a fresh driver, closed when the test
// ends.
func (s *suite) locker(t *testing.T) *locker.Locker {
	t.Helper()
	l := locker.New(s.open(t))
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// ttlFor rounds ttl as the driver would, so raw calls use a TTL it honours.
func ttlFor(d driver.Locker, ttl time.Duration) time.Duration {
	if c, ok := d.(driver.Capable); ok {
		return c.Capabilities().RoundTTL(ttl)
	}
	return ttl
}

func newKey(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("conformance/%s/%s", t.Name(), hex.EncodeToString(b[:]))
}

func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ctxT returns a context bounded well within the watchdog.
func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) callCtx(t *testing.T) context.Context { return ctxT(t, 10*time.Second+5*s.unit) }

// quick bounds a call that must not wait: one attempt, or a return once its
// context is done. It is generous, so that it holds on a loaded machine
// against a remote server, and far below any TTL the suite waits for.
const quick = 5 * time.Second

// within runs fn and fails the test if it does not return within d: a call
// that ignores its context, or waits where it should not, must not hang the
// suite.
func within(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// mustBeHeld checks that another owner cannot take key.
func (s *suite) mustBeHeld(t *testing.T, d driver.Locker, key string, why string) {
	t.Helper()
	o := newOwner()
	_, err := d.Acquire(s.callCtx(t), key, o, ttlFor(d, s.hold()))
	if err == nil {
		_ = d.Release(s.callCtx(t), key, o)
		t.Fatalf("%s: another owner acquired %q, which should still be held", why, key)
	}
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("%s: Acquire by another owner: got %v, want an error matching driver.ErrNotAcquired", why, err)
	}
}

// mustBeFree checks that another owner takes key at once; the key is then
// held by that owner, whom it returns.
func (s *suite) mustBeFree(t *testing.T, d driver.Locker, key string, why string) string {
	t.Helper()
	o := newOwner()
	if _, err := d.Acquire(s.callCtx(t), key, o, ttlFor(d, s.hold())); err != nil {
		t.Fatalf("%s: Acquire of %q, which should be free, by another owner: %v", why, key, err)
	}
	return o
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one matching %v", what, err, target)
	}
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// drainWake empties a wake channel of the wake-ups already sent.
func drainWake(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}
