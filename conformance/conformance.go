// Package conformance is the test suite every locker driver runs against
// itself, ours and third parties' alike, in the manner of testing/fstest:
//
//	func TestConformance(t *testing.T) {
//		conformance.Run(t, conformance.Harness{
//			Open: func(ctx context.Context) (driver.Locker, error) {
//				return mydriver.Open(ctx, serverURL)
//			},
//			MinTTL: 100 * time.Millisecond,
//		})
//	}
//
// Run checks each guarantee of package locker's driver contract through the
// raw driver.Locker and through locker.New: mutual exclusion under
// concurrent acquires, expiry after the TTL and not before, ownership
// (including of a former holder whose lock was taken over), a refresh that
// does not revive an expired lock, strictly increasing fencing tokens,
// idempotent acquire, prompt return once a context is done leaving nothing
// held, independent keys, Close; and the locker layer's waiting (woken by a
// release, not a poll), loss detection (Lost closes before another owner can
// get the key), renewal across several TTLs, cancelled waits, and contention
// among 8 lockers with an overlap detector.
//
// Subtest names are stable ("Driver/Expiry", "Locker/Contention", …) so a
// failure can be rerun with -run. Every subtest uses fresh keys and has a
// watchdog: a driver that hangs fails with a message naming the subtest
// instead of hanging the test binary. Optional interfaces a driver does not
// implement are skipped with a message. The suite is itself tested against
// deliberately broken drivers, each of which it must fail.
package conformance

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// Run runs the suite against the backend h opens. It fails t on any
// violation; it never passes a driver that breaks a guarantee it checks.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.Open == nil {
		t.Fatal("conformance: Harness.Open is nil")
	}
	s := &suite{h: h, unit: h.MinTTL}
	if s.unit < 100*time.Millisecond {
		s.unit = 100 * time.Millisecond
	}
	// Optional interfaces: subtests for the ones the driver lacks are not
	// run (and say so), rather than reported as skipped.
	probe := s.open(t)
	_, hasWaiter := probe.(driver.Waiter)
	_, hasBlocking := probe.(driver.BlockingAcquirer)
	_, hasInspector := probe.(driver.Inspector)
	for name, has := range map[string]bool{"Waiter": hasWaiter, "BlockingAcquirer": hasBlocking, "Inspector": hasInspector} {
		if !has {
			t.Logf("conformance: %T does not implement driver.%s; its subtests are not run", probe, name)
		}
	}
	_ = probe.Close()
	t.Run("Driver", func(t *testing.T) {
		s.run(t, "MutualExclusion", s.driverMutualExclusion)
		s.run(t, "AtomicAcquire", s.driverAtomicAcquire)
		s.run(t, "Expiry", s.driverExpiry)
		s.run(t, "Ownership", s.driverOwnership)
		s.run(t, "RefreshDoesNotRevive", s.driverRefreshDoesNotRevive)
		s.run(t, "Fencing", s.driverFencing)
		s.run(t, "IdempotentAcquire", s.driverIdempotent)
		s.run(t, "Context", s.driverContext)
		s.run(t, "Keys", s.driverKeys)
		s.run(t, "BadInput", s.driverBadInput)
		s.run(t, "Close", s.driverClose)
		if hasWaiter {
			s.run(t, "Waiter", s.driverWaiter)
		}
		if hasBlocking {
			s.run(t, "BlockingAcquirer", s.driverBlocking)
		}
		if hasInspector {
			s.run(t, "Inspector", s.driverInspector)
		}
	})
	t.Run("Locker", func(t *testing.T) {
		s.run(t, "TryAcquire", s.lockerTryAcquire)
		s.run(t, "Fencing", s.lockerFencing)
		s.run(t, "BadInput", s.lockerBadInput)
		if hasWaiter || hasBlocking {
			s.run(t, "WokenByRelease", s.lockerWokenByRelease)
		} else {
			t.Logf("conformance: %T has neither driver.Waiter nor driver.BlockingAcquirer: "+
				"package locker waits for it by polling, and Locker/WokenByRelease is not run", probe)
		}
		s.run(t, "LostOnExpiry", s.lockerLostOnExpiry)
		s.run(t, "DoCancelledOnLoss", s.lockerDoCancelledOnLoss)
		s.run(t, "AutoRenew", s.lockerAutoRenew)
		s.run(t, "RefreshAfterLoss", s.lockerRefreshAfterLoss)
		s.run(t, "CancelledWait", s.lockerCancelledWait)
		s.run(t, "Contention", s.lockerContention)
		s.run(t, "Close", s.lockerClose)
	})
}

type suite struct {
	h    Harness
	unit time.Duration // the TTL most subtests use
}

// run runs one subtest under a watchdog.
func (s *suite) run(t *testing.T, name string, fn func(t *testing.T)) {
	t.Run(name, func(t *testing.T) {
		limit := 60*time.Second + 30*s.unit
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

// ttl rounds d as the driver would, so raw calls use a TTL it honours.
func ttlFor(d driver.Locker, ttl time.Duration) time.Duration {
	if c, ok := d.(driver.Capable); ok {
		return c.Capabilities().RoundTTL(ttl)
	}
	return ttl
}

// tolerance is the drift allowance of package locker: how much earlier than
// its TTL a lock may be seen to expire by this process's clock.
func tolerance(ttl time.Duration) time.Duration { return ttl/100 + 2*time.Millisecond }

// expiryBound is how long after its TTL a backend may take to actually free
// a key (etcd checks leases periodically).
func (s *suite) expiryBound(ttl time.Duration) time.Duration { return 2*ttl + 3*time.Second }

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

// within runs fn and fails the test if it does not return within d: a call
// that ignores its context must not hang the suite.
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
		t.Fatalf("%s did not return within %v of its context being done", what, d)
	}
}

// mustAcquire takes key for owner through the raw driver.
func (s *suite) mustAcquire(t *testing.T, d driver.Locker, key, owner string, ttl time.Duration) uint64 {
	t.Helper()
	tok, err := d.Acquire(s.callCtx(t), key, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, owner %s): %v", key, owner[:8], err)
	}
	return tok
}

// mustBeHeld checks that another owner cannot take key.
func (s *suite) mustBeHeld(t *testing.T, d driver.Locker, key string, ttl time.Duration, why string) {
	t.Helper()
	o := newOwner()
	_, err := d.Acquire(s.callCtx(t), key, o, ttl)
	if err == nil {
		_ = d.Release(s.callCtx(t), key, o)
		t.Fatalf("%s: another owner acquired %q, which should still be held", why, key)
	}
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("%s: Acquire by another owner: got %v, want an error matching driver.ErrNotAcquired", why, err)
	}
}

// waitFree polls until another owner can take key, and returns that owner
// and when its successful call returned. The key is then held by that owner.
func (s *suite) waitFree(t *testing.T, d driver.Locker, key string, ttl, limit time.Duration, why string) (owner string, tok uint64, at time.Time) {
	t.Helper()
	owner = newOwner()
	deadline := time.Now().Add(limit)
	poll := max(s.unit/50, time.Millisecond)
	for {
		tok, err := d.Acquire(s.callCtx(t), key, owner, ttl)
		at = time.Now()
		if err == nil {
			return owner, tok, at
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%s: Acquire while waiting for %q to be free: %v", why, key, err)
		}
		if at.After(deadline) {
			t.Fatalf("%s: %q still held after %v", why, key, limit)
		}
		time.Sleep(poll) // polling is the point here: the suite probes the server
	}
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
