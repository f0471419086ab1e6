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

// sharedSubtests check driver.SharedLocker; they run only on a driver that
// implements it.
func (s *suite) sharedSubtests() []subtest {
	return []subtest{
		{"SharedLimit", s.sharedLimit, "SharedLocker"},
		{"SharedLeases", s.sharedLeases, "SharedLocker"},
		{"SharedOwnership", s.sharedOwnership, "SharedLocker"},
		{"SharedTokens", s.sharedTokens, "SharedLocker"},
		{"SharedWriterPreference", s.sharedWriterPreference, "SharedLocker"},
		{"SharedIdempotent", s.sharedIdempotent, "SharedLocker"},
		{"SharedBadInput", s.sharedBadInput, "SharedLocker"},
		{"SharedPerCallLimit", s.sharedPerCallLimit, "SharedLocker"},
		{"SharedNamespaces", s.sharedNamespaces, "SharedLocker"},
		{"SharedWakeups", s.sharedWakeups, "SharedLocker"},
		{"SharedContext", s.sharedContext, "SharedLocker"},
	}
}

func (s *suite) openShared(t *testing.T) driver.SharedLocker {
	t.Helper()
	return s.open(t).(driver.SharedLocker)
}

func req(mode driver.SharedMode, owner string, ttl time.Duration, n int) driver.SharedRequest {
	return driver.SharedRequest{Mode: mode, Owner: owner, TTL: ttl, Limit: n}
}

func waiting(r driver.SharedRequest) driver.SharedRequest { r.Wait = true; return r }

// sgrant takes a shared hold, failing the test on an error.
func (s *suite) sgrant(t *testing.T, d driver.SharedLocker, key string, r driver.SharedRequest) grant {
	t.Helper()
	g := grant{key: key, sent: time.Now(), ttl: s.effective(r.TTL)}
	tok, err := d.AcquireShared(s.callCtx(t), key, r)
	g.returned = time.Now()
	if err != nil {
		t.Fatalf("AcquireShared(%q, %v, owner %.8s, limit %d): %v", key, r.Mode, r.Owner, r.Limit, err)
	}
	g.token = tok
	return g
}

// mustRefuse checks that r is refused now with ErrNotAcquired.
func (s *suite) mustRefuse(t *testing.T, d driver.SharedLocker, key string, r driver.SharedRequest, why string) {
	t.Helper()
	s.mustRefuseUntil(t, d, key, r, why, time.Time{})
}

// mustRefuseUntil is mustRefuse for a refusal owed only until until (zero:
// always): a grant whose reply came back at or after until may have been
// made after the hold in the way ended, so it is released and accepted.
func (s *suite) mustRefuseUntil(t *testing.T, d driver.SharedLocker, key string, r driver.SharedRequest, why string, until time.Time) {
	t.Helper()
	_, err := d.AcquireShared(s.callCtx(t), key, r)
	back := time.Now()
	if err == nil {
		_ = d.ReleaseShared(s.callCtx(t), key, r.Mode, r.Owner)
		if !until.IsZero() && !back.Before(until) {
			return
		}
		t.Fatalf("%s: %v by a new owner was granted", why, r.Mode)
	}
	wantErr(t, why, err, driver.ErrNotAcquired)
}

func (s *suite) holders(t *testing.T, d driver.SharedLocker, key string, mode driver.SharedMode) []driver.SharedInfo {
	t.Helper()
	hs, err := d.InspectShared(s.callCtx(t), key, mode)
	if err != nil {
		t.Fatalf("InspectShared: %v", err)
	}
	return hs
}

// The limit: never more than n permit holders, never a writer beside
// anyone, also when many Lockers race for the key.
func (s *suite) sharedLimit(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	for range 3 {
		s.sgrant(t, a, key, req(driver.SharedPermit, newOwner(), ttl, 3))
	}
	s.mustRefuse(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 3), "a fourth permit of 3")
	if hs := s.holders(t, b, key, driver.SharedPermit); len(hs) != 3 {
		t.Fatalf("InspectShared lists %d permit holders, want 3", len(hs))
	}
	rw := newKey(t)
	w := newOwner()
	s.sgrant(t, a, rw, req(driver.SharedWrite, w, ttl, 0))
	s.mustRefuse(t, b, rw, req(driver.SharedRead, newOwner(), ttl, 0), "a read beside a writer")
	s.mustRefuse(t, b, rw, req(driver.SharedWrite, newOwner(), ttl, 0), "a second writer")
	if err := a.ReleaseShared(s.callCtx(t), rw, driver.SharedWrite, w); err != nil {
		t.Fatal(err)
	}
	s.sgrant(t, a, rw, req(driver.SharedRead, newOwner(), ttl, 0))
	s.sgrant(t, b, rw, req(driver.SharedRead, newOwner(), ttl, 0))
	s.mustRefuse(t, b, rw, req(driver.SharedWrite, newOwner(), ttl, 0), "a writer beside readers")

	// 8 Lockers race one-shot requests for 2 permits: the holders the
	// server lists never exceed 2.
	race := newKey(t)
	var wg sync.WaitGroup
	var granted atomic.Int64
	for range 8 {
		d := s.openShared(t)
		wg.Go(func() {
			for range 5 {
				o := newOwner()
				if _, err := d.AcquireShared(s.callCtx(t), race, req(driver.SharedPermit, o, ttl, 2)); err == nil {
					granted.Add(1)
					if hs, err := d.InspectShared(s.callCtx(t), race, driver.SharedPermit); err == nil && len(hs) > 2 {
						t.Errorf("%d holders of a semaphore of 2", len(hs))
					}
					_ = d.ReleaseShared(s.callCtx(t), race, driver.SharedPermit, o)
				}
			}
		})
	}
	wg.Wait()
	if granted.Load() == 0 {
		t.Fatal("no permit granted in the race")
	}
}

// Leases: each holder expires on its own after its TTL, not before; the
// others keep theirs, through another's release and another's expiry.
func (s *suite) sharedLeases(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key := newKey(t)
	short, long := ttlFor(s.open(t), s.unit), ttlFor(s.open(t), s.hold())
	g := s.sgrant(t, a, key, req(driver.SharedPermit, newOwner(), short, 3))
	keep, gone := newOwner(), newOwner()
	s.sgrant(t, a, key, req(driver.SharedPermit, keep, long, 3))
	s.sgrant(t, a, key, req(driver.SharedPermit, gone, long, 3))
	if err := a.ReleaseShared(s.callCtx(t), key, driver.SharedPermit, gone); err != nil {
		t.Fatal(err)
	}
	// The short lease may have ended by now on a slow machine: then only
	// the long one is left.
	hs := s.holders(t, b, key, driver.SharedPermit)
	if ended := !time.Now().Before(s.earliest(g)); len(hs) != 2 && (!ended || len(hs) != 1 || hs[0].Owner != keep) {
		t.Fatalf("after one release, %d holders are listed, want the other 2", len(hs))
	}
	if time.Now().Before(s.earliest(g)) {
		s.mustRefuseUntil(t, b, key, req(driver.SharedPermit, newOwner(), long, 2), "a permit of 2 before the short lease ran out", s.earliest(g))
	}
	time.Sleep(time.Until(s.latest(g)))
	s.sgrant(t, b, key, req(driver.SharedPermit, newOwner(), long, 2)) // the short lease's permit came back
	if s.caps.LockerBound {
		b = a // the owner's own calls go through the Locker that holds
	}
	if err := b.RefreshShared(s.callCtx(t), key, driver.SharedPermit, keep, long); err != nil {
		t.Fatalf("the long lease was lost with the short one: %v", err)
	}
}

// Ownership: only the owner refreshes or releases its hold, and only in the
// mode it holds.
func (s *suite) sharedOwnership(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	o := newOwner()
	s.sgrant(t, a, key, req(driver.SharedRead, o, ttl, 0))
	other := newOwner()
	wantErr(t, "RefreshShared by another owner", b.RefreshShared(s.callCtx(t), key, driver.SharedRead, other, ttl), driver.ErrNotHeld)
	wantErr(t, "ReleaseShared by another owner", b.ReleaseShared(s.callCtx(t), key, driver.SharedRead, other), driver.ErrNotHeld)
	wantErr(t, "ReleaseShared in the other mode", b.ReleaseShared(s.callCtx(t), key, driver.SharedWrite, o), driver.ErrNotHeld)
	wantErr(t, "ReleaseShared of the semaphore", b.ReleaseShared(s.callCtx(t), key, driver.SharedPermit, o), driver.ErrNotHeld)
	hs := s.holders(t, b, key, driver.SharedRead)
	if len(hs) != 1 || hs[0].Owner != o || hs[0].Mode != driver.SharedRead {
		t.Fatalf("after others' refresh and release: holders %+v, want the reader", hs)
	}
	if s.caps.LockerBound {
		b = a // the owner's own calls go through the Locker that holds
	}
	if err := b.ReleaseShared(s.callCtx(t), key, driver.SharedRead, o); err != nil {
		t.Fatalf("ReleaseShared by the owner through another Locker: %v", err)
	}
	wantErr(t, "a second ReleaseShared", b.ReleaseShared(s.callCtx(t), key, driver.SharedRead, o), driver.ErrNotHeld)
}

// Tokens: every grant of a key, permit, read or write, through any Locker,
// after releases and expiries, carries a token above every earlier one.
func (s *suite) sharedTokens(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl, short := newKey(t), ttlFor(s.open(t), s.hold()), ttlFor(s.open(t), s.unit)
	var last uint64
	next := func(d driver.SharedLocker, r driver.SharedRequest, what string) grant {
		t.Helper()
		g := s.sgrant(t, d, key, r)
		if g.token <= last {
			t.Fatalf("%s: token %d, not above the earlier %d", what, g.token, last)
		}
		last = g.token
		return g
	}
	r1, r2 := newOwner(), newOwner()
	next(a, req(driver.SharedRead, r1, ttl, 0), "first read")
	next(b, req(driver.SharedRead, r2, ttl, 0), "second read")
	_ = a.ReleaseShared(s.callCtx(t), key, driver.SharedRead, r1)
	_ = b.ReleaseShared(s.callCtx(t), key, driver.SharedRead, r2)
	next(b, req(driver.SharedWrite, newOwner(), short, 0), "a write after reads")
	time.Sleep(short + late(short))
	next(a, req(driver.SharedWrite, newOwner(), ttl, 0), "a write after an expired write")
	for i := range 3 {
		next([]driver.SharedLocker{a, b}[i%2], req(driver.SharedPermit, newOwner(), ttl, 5), "a permit")
	}
}

// Writer preference: once a writer waits, later reads wait behind it; it
// is granted when the reads in force at its arrival end.
func (s *suite) sharedWriterPreference(t *testing.T) {
	a, b, c := s.openShared(t), s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	r1, r2 := newOwner(), newOwner()
	s.sgrant(t, a, key, req(driver.SharedRead, r1, ttl, 0))
	s.sgrant(t, a, key, req(driver.SharedRead, r2, ttl, 0))
	wctx, cancel := context.WithCancel(s.callCtx(t))
	defer cancel()
	w := newOwner()
	wdone := make(chan error, 1)
	go func() {
		_, err := b.AcquireShared(wctx, key, waiting(req(driver.SharedWrite, w, ttl, 0)))
		wdone <- err
	}()
	// Once the writer waits, a one-shot read fails though only readers hold.
	waitFor(t, quick, "a one-shot read to be refused behind the waiting writer", func() bool {
		o := newOwner()
		_, err := c.AcquireShared(s.callCtx(t), key, req(driver.SharedRead, o, ttl, 0))
		if err == nil {
			_ = c.ReleaseShared(s.callCtx(t), key, driver.SharedRead, o)
		}
		return errors.Is(err, driver.ErrNotAcquired)
	})
	late := newOwner()
	rdone := make(chan error, 1)
	go func() {
		_, err := c.AcquireShared(wctx, key, waiting(req(driver.SharedRead, late, ttl, 0)))
		rdone <- err
	}()
	for _, o := range []string{r1, r2} {
		select {
		case err := <-wdone:
			t.Fatalf("the writer returned (%v) while earlier readers still hold", err)
		case err := <-rdone:
			t.Fatalf("a reader that came after the writer returned first (%v)", err)
		default:
		}
		if err := a.ReleaseShared(s.callCtx(t), key, driver.SharedRead, o); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-wdone:
		if err != nil {
			t.Fatalf("the writer: %v", err)
		}
	case <-time.After(wakeBound):
		t.Fatalf("the writer was not granted within %v of the last earlier reader's release", wakeBound)
	}
	select {
	case err := <-rdone:
		t.Fatalf("the late reader returned (%v) while the writer holds", err)
	default:
	}
	_ = b.ReleaseShared(s.callCtx(t), key, driver.SharedWrite, w)
	select {
	case err := <-rdone:
		if err != nil {
			t.Fatalf("the late reader: %v", err)
		}
	case <-time.After(wakeBound):
		t.Fatalf("the late reader was not granted within %v of the writer's release", wakeBound)
	}
}

// Idempotent acquire by the same owner; no upgrades or downgrades, refused
// at once even by a waiting request. On a LockerBound driver the same
// owner's calls go through the Locker that holds.
func (s *suite) sharedIdempotent(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	if s.caps.LockerBound {
		b = a
	}
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	for _, mode := range []driver.SharedMode{driver.SharedPermit, driver.SharedRead, driver.SharedWrite} {
		k, o := key+"/"+mode.String(), newOwner()
		g := s.sgrant(t, a, k, req(mode, o, ttl, 1))
		again := s.sgrant(t, b, k, req(mode, o, ttl, 1))
		if again.token != g.token {
			t.Fatalf("%v again by its owner: token %d, want the same %d", mode, again.token, g.token)
		}
	}
	r := newOwner()
	s.sgrant(t, a, key, req(driver.SharedRead, r, ttl, 0))
	s.sgrant(t, a, key, req(driver.SharedRead, newOwner(), ttl, 0))
	uctx, cancel := context.WithTimeout(s.callCtx(t), quick)
	defer cancel()
	_, err := b.AcquireShared(uctx, key, waiting(req(driver.SharedWrite, r, ttl, 0)))
	wantErr(t, "a waiting write by a reader (an upgrade; it must fail at once, not wait)", err, driver.ErrInvalid)
	w := newOwner()
	s.sgrant(t, a, key+"/w", req(driver.SharedWrite, w, ttl, 0))
	_, err = b.AcquireShared(s.callCtx(t), key+"/w", req(driver.SharedRead, w, ttl, 0))
	wantErr(t, "a read by the writer", err, driver.ErrInvalid)
	if err := a.RefreshShared(s.callCtx(t), key, driver.SharedRead, r, ttl); err != nil {
		t.Fatalf("the reader lost its hold to its upgrade attempt: %v", err)
	}
}

// Bad input: ErrInvalid, nothing held.
func (s *suite) sharedBadInput(t *testing.T) {
	a := s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	for _, r := range []driver.SharedRequest{
		req(driver.SharedPermit, newOwner(), ttl, 0),
		req(driver.SharedPermit, newOwner(), ttl, -1),
		req(driver.SharedPermit, newOwner(), ttl, driver.MaxSharedLimit+1),
		req(driver.SharedPermit, newOwner(), 0, 1),
		req(0, newOwner(), ttl, 1),
		req(driver.SharedWrite+1, newOwner(), ttl, 1),
	} {
		_, err := a.AcquireShared(s.callCtx(t), key, r)
		wantErr(t, fmt.Sprintf("AcquireShared(mode %d, limit %d, ttl %v)", r.Mode, r.Limit, r.TTL), err, driver.ErrInvalid)
	}
	_, err := a.AcquireShared(s.callCtx(t), "", req(driver.SharedRead, newOwner(), ttl, 0))
	wantErr(t, "AcquireShared with an empty key", err, driver.ErrInvalid)
	if hs := s.holders(t, a, key, driver.SharedPermit); len(hs) != 0 {
		t.Fatalf("bad requests left holders: %+v", hs)
	}
	s.sgrant(t, a, key, req(driver.SharedPermit, newOwner(), ttl, driver.MaxSharedLimit))
}

// The limit is per request: a grant is made only while fewer than the
// request's own n hold the key.
func (s *suite) sharedPerCallLimit(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	for range 3 {
		s.sgrant(t, a, key, req(driver.SharedPermit, newOwner(), ttl, 4))
	}
	s.mustRefuse(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 2), "limit 2 with 3 holders")
	s.mustRefuse(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 3), "limit 3 with 3 holders")
	s.sgrant(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 4))
	s.mustRefuse(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 4), "limit 4 with 4 holders")
}

// A mutex, a semaphore and a read-write lock on one key are three locks.
func (s *suite) sharedNamespaces(t *testing.T) {
	d := s.open(t)
	a, b := d.(driver.SharedLocker), s.openShared(t)
	key, ttl := newKey(t), ttlFor(d, s.hold())
	s.sgrant(t, a, key, req(driver.SharedPermit, newOwner(), ttl, 1))
	s.sgrant(t, a, key, req(driver.SharedWrite, newOwner(), ttl, 0))
	if _, err := d.Acquire(s.callCtx(t), key, newOwner(), ttl); err != nil {
		t.Fatalf("the mutex beside a permit and a write hold of the same key: %v", err)
	}
	s.mustRefuse(t, b, key, req(driver.SharedPermit, newOwner(), ttl, 1), "a permit of a full semaphore")
	s.mustRefuse(t, b, key, req(driver.SharedRead, newOwner(), ttl, 0), "a read beside the writer")
	hs := s.holders(t, b, key, driver.SharedPermit)
	if len(hs) != 1 || hs[0].Mode != driver.SharedPermit {
		t.Fatalf("the semaphore lists %+v, want its one permit", hs)
	}
}

// Waits without polling: a release grants the waiters that fit at once, an
// expiry too; those that do not fit stay waiting.
func (s *suite) sharedWakeups(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	w := newOwner()
	s.sgrant(t, a, key, req(driver.SharedWrite, w, ttl, 0))
	ctx, cancel := context.WithCancel(s.callCtx(t))
	defer cancel()
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := b.AcquireShared(ctx, key, waiting(req(driver.SharedRead, newOwner(), ttl, 0)))
			done <- err
		}()
	}
	// Give the waits time to reach the server; a driver that answers a
	// wait only later still passes, as the bound counts from the release.
	waitFor(t, quick, "the readers to wait", func() bool {
		return len(s.holders(t, a, key, driver.SharedRead)) == 1
	})
	time.Sleep(s.unit / 4)
	released := time.Now()
	if err := a.ReleaseShared(s.callCtx(t), key, driver.SharedWrite, w); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("a waiting reader: %v", err)
			}
		case <-time.After(wakeBound - time.Since(released)):
			t.Fatalf("the waiting readers were not all granted within %v of the writer's release", wakeBound)
		}
	}

	// An expiry wakes a waiter too.
	k2, short := newKey(t), ttlFor(s.open(t), s.unit)
	g := s.sgrant(t, a, k2, req(driver.SharedPermit, newOwner(), short, 1))
	_, err := b.AcquireShared(s.callCtx(t), k2, waiting(req(driver.SharedPermit, newOwner(), ttl, 1)))
	if err != nil {
		t.Fatal(err)
	}
	if at := time.Now(); at.After(s.latest(g).Add(wakeBound)) {
		t.Fatalf("the waiter was granted %v after the holder's lease ended (TTL %v)", at.Sub(s.latest(g)), short)
	}
}

// Context: a waiting request returns promptly once its ctx is done and
// leaves nothing held or queued: a waiting writer that gives up no longer
// blocks readers.
func (s *suite) sharedContext(t *testing.T) {
	a, b := s.openShared(t), s.openShared(t)
	key, ttl := newKey(t), ttlFor(s.open(t), s.hold())
	s.sgrant(t, a, key, req(driver.SharedRead, newOwner(), ttl, 0))
	w := newOwner()
	ctx, cancel := context.WithTimeout(s.callCtx(t), s.unit)
	defer cancel()
	var err error
	within(t, quick+s.unit, "a waiting write whose ctx ends", func() {
		_, err = b.AcquireShared(ctx, key, waiting(req(driver.SharedWrite, w, ttl, 0)))
	})
	wantErr(t, "a waiting write whose ctx ended", err, context.DeadlineExceeded)
	s.sgrant(t, a, key, req(driver.SharedRead, newOwner(), ttl, 0)) // not behind the abandoned writer
	for _, h := range s.holders(t, a, key, driver.SharedRead) {
		if h.Owner == w {
			t.Fatal("the abandoned writer holds the lock")
		}
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	_, err = b.AcquireShared(done, newKey(t), req(driver.SharedRead, newOwner(), ttl, 0))
	wantErr(t, "AcquireShared with a done ctx", err, context.Canceled)
}

// sharedLockerSubtests check package locker's Semaphore and RWMutex on the
// driver; they run only on a driver that implements driver.SharedLocker.
func (s *suite) sharedLockerSubtests() []subtest {
	return []subtest{{"SharedContention", s.lockerSharedContention, "SharedLocker"}}
}

// SharedContention: 32 Lockers take permits of a semaphore of 4 and holds
// of a read-write lock, many rounds each: never more than 4 permit holders,
// never a writer beside anyone, and every token above those of the holds
// released before it was asked for.
func (s *suite) lockerSharedContention(t *testing.T) {
	const lockers, rounds, n = 32, 6, 4
	semKey, rwKey := newKey(t), newKey(t)
	ttl := max(s.unit, time.Second)
	var permits, readers, writers atomic.Int32
	var mu sync.Mutex
	var released uint64 // the highest token of a released hold, per kind's key
	var releasedRW uint64
	check := func(what string, floor, tok uint64) {
		if tok <= floor {
			t.Errorf("%s: token %d not above %d, released before the request", what, tok, floor)
		}
	}
	var wg sync.WaitGroup
	for i := range lockers {
		l := s.locker(t)
		wg.Go(func() {
			sem, rw := l.Semaphore(semKey, n), l.RWMutex(rwKey)
			for r := range rounds {
				mu.Lock()
				floor, floorRW := released, releasedRW
				mu.Unlock()
				lk, err := sem.Acquire(s.callCtx(t), locker.WithTTL(ttl))
				if err != nil {
					t.Errorf("locker %d round %d: Semaphore.Acquire: %v", i, r, err)
					return
				}
				check("a permit", floor, lk.Token())
				if c := permits.Add(1); c > n {
					t.Errorf("locker %d round %d: %d permit holders of a semaphore of %d", i, r, c, n)
				}
				time.Sleep(2 * time.Millisecond) // the critical section
				permits.Add(-1)
				mu.Lock()
				released = max(released, lk.Token())
				mu.Unlock()
				if err := lk.Release(s.callCtx(t)); err != nil {
					t.Errorf("locker %d round %d: Release: %v", i, r, err)
				}

				write := (i+r)%4 == 0
				acquire, mine, others := rw.AcquireRead, &readers, &writers
				if write {
					acquire, mine, others = rw.AcquireWrite, &writers, &readers
				}
				lk, err = acquire(s.callCtx(t), locker.WithTTL(ttl))
				if err != nil {
					t.Errorf("locker %d round %d: RWMutex: %v", i, r, err)
					return
				}
				check("an RW hold", floorRW, lk.Token())
				c := mine.Add(1)
				if others.Load() != 0 && (write || writers.Load() != 0) || write && c != 1 {
					t.Errorf("locker %d round %d: a writer beside another holder", i, r)
				}
				time.Sleep(2 * time.Millisecond)
				mine.Add(-1)
				mu.Lock()
				releasedRW = max(releasedRW, lk.Token())
				mu.Unlock()
				if err := lk.Release(s.callCtx(t)); err != nil {
					t.Errorf("locker %d round %d: Release: %v", i, r, err)
				}
			}
		})
	}
	wg.Wait()
}
