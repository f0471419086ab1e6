package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// The timing checks only fail on proof. A call that sets a lock's TTL was
// sent at some moment and returned at a later one; the server started the
// TTL in between. So the server may free the lock no earlier than
// sent + TTL − the driver's margin (driver.Capabilities.Margin), and must
// have freed it by returned + TTL + late(TTL). A probe (an Acquire by a
// fresh owner) that succeeds and returns before the first moment proves an
// early expiry; a probe that is sent after the second moment and finds the
// key held proves a late one. A slow machine delays the probes, which can
// only hide a violation, never invent one.

// grant is what a call that set a lock's TTL (Acquire, Refresh,
// AcquireWait) tells the suite about when the server may free the lock.
type grant struct {
	key            string
	token          uint64
	sent, returned time.Time
	ttl            time.Duration // effective: as Capabilities.RoundTTL rounds it
}

// late is how long after its TTL a backend may take to free a lock. It
// covers backends that expire locks on a timer (etcd revokes expired leases
// on a 500ms tick) on a loaded machine, and is small enough that a TTL
// kept far longer than asked (a fixed TTL, seconds for milliseconds) shows.
func late(ttl time.Duration) time.Duration { return ttl/4 + 750*time.Millisecond }

// long is the suite's long TTL beside unit: long enough that a lock given
// it is still held well after one given unit must have been freed, so that
// no single fixed TTL fits both.
func (s *suite) long() time.Duration { return 2*s.unit + 2*late(s.unit) }

// medium is a TTL between unit and long, for a lock that must outlive the
// next call by a wide margin before that call makes it longer.
func (s *suite) medium() time.Duration { return min(5*s.unit, s.long()/2) }

// hold is a TTL no subtest outlives, for locks that must stay held while a
// subtest makes its calls, however slow the machine.
func (s *suite) hold() time.Duration { return max(20*s.unit, 30*time.Second) }

// wakeBound bounds how long after a release or an expiry a waiter may be woken or
// a blocked AcquireWait granted. Notifications take a round trip; the root's
// fallback timer fires after 1.6s at the earliest, which this stays under.
const wakeBound = time.Second

func (s *suite) margin(ttl time.Duration) time.Duration { return s.caps.Margin(ttl) }

func (s *suite) earliest(g grant) time.Time { return g.sent.Add(g.ttl - s.margin(g.ttl)) }

func (s *suite) latest(g grant) time.Time { return g.returned.Add(g.ttl + late(g.ttl)) }

func (s *suite) effective(ttl time.Duration) time.Duration { return s.caps.RoundTTL(ttl) }

// acquire takes key for owner with ttl through d and returns the grant.
func (s *suite) acquire(t *testing.T, d driver.Locker, key, owner string, ttl time.Duration) grant {
	t.Helper()
	g := grant{key: key, sent: time.Now(), ttl: s.effective(ttl)}
	tok, err := d.Acquire(s.callCtx(t), key, owner, ttl)
	g.returned = time.Now()
	if err != nil {
		t.Fatalf("Acquire(%q, owner %.8s, ttl %v): %v", key, owner, ttl, err)
	}
	g.token = tok
	return g
}

// refresh refreshes key for owner with ttl through d and returns the grant
// it makes.
func (s *suite) refresh(t *testing.T, d driver.Locker, key, owner string, ttl time.Duration, tok uint64) grant {
	t.Helper()
	g := grant{key: key, token: tok, sent: time.Now(), ttl: s.effective(ttl)}
	err := d.Refresh(s.callCtx(t), key, owner, ttl)
	g.returned = time.Now()
	if err != nil {
		t.Fatalf("Refresh(%q, owner %.8s, ttl %v) by the holder: %v", key, owner, ttl, err)
	}
	return g
}

// expiry is one lock whose end expectExpiry watches.
type expiry struct {
	g    grant
	what string // the check, for the failure message
	// onlyLatest drops the early-expiry check (a lock a driver may end at
	// once, such as one left behind by Close).
	onlyLatest bool
}

// taken is a probe that took a key.
type taken struct {
	owner    string
	token    uint64
	sent, at time.Time // when the probe's Acquire was sent and returned
}

// expectExpiry probes every key with Acquires by fresh owners through d
// until each has been taken, and fails at the first proof that one was
// freed before its grant allows or held after it. It returns, per key, the
// probe that took it; each key is then held by that probe's owner.
func (s *suite) expectExpiry(t *testing.T, d driver.Locker, es ...expiry) []taken {
	t.Helper()
	out := make([]taken, len(es))
	left := len(es)
	poll := max(s.unit/20, 2*time.Millisecond)
	for left > 0 {
		for i, e := range es {
			if !out[i].at.IsZero() {
				continue
			}
			o := newOwner()
			sent := time.Now()
			tok, err := d.Acquire(s.callCtx(t), e.g.key, o, ttlFor(d, 10*s.unit))
			now := time.Now()
			switch {
			case err == nil:
				if !e.onlyLatest && now.Before(s.earliest(e.g)) {
					t.Fatalf("%s: another owner took %q %v after the call that gave it a TTL of %v was sent: "+
						"before the TTL (less the driver's margin of %v) ran out",
						e.what, e.g.key, now.Sub(e.g.sent).Round(time.Millisecond), e.g.ttl, s.margin(e.g.ttl))
				}
				out[i] = taken{owner: o, token: tok, sent: sent, at: now}
				left--
			case errors.Is(err, driver.ErrNotAcquired):
				if sent.After(s.latest(e.g)) {
					t.Fatalf("%s: %q still held %v after the call that gave it a TTL of %v returned "+
						"(the suite allows the backend %v past the TTL to free it)",
						e.what, e.g.key, sent.Sub(e.g.returned).Round(time.Millisecond), e.g.ttl, late(e.g.ttl))
				}
			default:
				t.Fatalf("%s: Acquire of %q by another owner while waiting for it to expire: %v", e.what, e.g.key, err)
			}
		}
		if left > 0 {
			time.Sleep(s.nextPoll(es, out, poll)) // polling is the point: the suite probes the server
		}
	}
	return out
}

// waitExpired waits, without taking the key, until the lock of g has
// certainly ended: until Inspect reports it free where the driver can
// inspect, else until the latest moment g allows.
func (s *suite) waitExpired(t *testing.T, d driver.Locker, g grant) {
	t.Helper()
	in, ok := d.(driver.Inspector)
	if !ok {
		time.Sleep(time.Until(s.latest(g)))
		return
	}
	for {
		sent := time.Now()
		_, err := in.Inspect(s.callCtx(t), g.key)
		if errors.Is(err, driver.ErrNotHeld) {
			return
		}
		if err != nil {
			t.Fatalf("Inspect(%q) while waiting for its lock to expire: %v", g.key, err)
		}
		if sent.After(s.latest(g)) {
			t.Fatalf("Inspect(%q) still reports a holder %v after the call that gave it a TTL of %v returned",
				g.key, sent.Sub(g.returned).Round(time.Millisecond), g.ttl)
		}
		time.Sleep(max(s.unit/20, 2*time.Millisecond))
	}
}

// notBefore fails the test if an event the suite must not see before
// moment `after` (a grant while the key was held, a wake-up by an expiry)
// happened before it.
func notBefore(t *testing.T, what string, at, after time.Time) {
	t.Helper()
	if at.Before(after) {
		t.Fatalf("%s %v before it could have", what, after.Sub(at).Round(time.Millisecond))
	}
}

func fmtDur(d time.Duration) string { return fmt.Sprint(d.Round(time.Millisecond)) }

// nextPoll is poll, or 1ms around the earliest moment an expiry may come,
// so that a backend that frees a key a little too soon is caught every time
// rather than when a probe happens to land in the gap.
func (s *suite) nextPoll(es []expiry, out []taken, poll time.Duration) time.Duration {
	for i, e := range es {
		if out[i].at.IsZero() {
			if d := time.Until(s.earliest(e.g)); d > -poll && d < 2*poll {
				return time.Millisecond
			}
		}
	}
	return poll
}
