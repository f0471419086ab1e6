package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// holdLostBound is how soon after another client ends the holder's lock on
// the server (a delete, a revoked lease, an overwrite) the holder's Lost()
// must close, once the lock has been held for holdSettled. The package
// documentation and the README quote it.
const holdLostBound = 50 * time.Millisecond

// holdSettled is how long a lock is held before the fault in the tests
// bound by holdLostBound. A watch that starts at a revision already past
// (any write since the grant) waits for etcd's unsynced-watcher loop, which
// runs every 100ms, before it delivers events; after that they are pushed
// as they happen.
const holdSettled = 200 * time.Millisecond

// holdEarlyBound bounds Lost() for a fault right after the grant: the
// unsynced-watcher period (100ms) plus holdLostBound.
const holdEarlyBound = 150 * time.Millisecond

// holdTTL is the TTL of the hold-watch tests: long enough that neither
// expiry nor the safe deadline can close Lost() within a test's bounds.
const holdTTL = 10 * time.Second

// fencedRegister stands for a resource that checks fencing tokens: it
// accepts a write only if its token is at least the highest it has seen.
type fencedRegister struct {
	mu       sync.Mutex
	highest  uint64
	accepted []fencedWrite
	rejected int
}

type fencedWrite struct {
	who   string
	token uint64
}

func (r *fencedRegister) write(who string, token uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		r.rejected++
		return
	}
	r.highest = token
	r.accepted = append(r.accepted, fencedWrite{who, token})
}

// check fails the test if a write was accepted after one with a higher
// token, or if want is set and no write by want was accepted.
func (r *fencedRegister) check(t *testing.T, want string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var prev uint64
	seen := false
	for i, w := range r.accepted {
		if w.token < prev {
			t.Fatalf("write %d (%s, token %d) accepted after token %d", i, w.who, w.token, prev)
		}
		prev = w.token
		seen = seen || w.who == want
	}
	if want != "" && !seen {
		t.Fatalf("no write by %s accepted", want)
	}
	t.Logf("fenced register: %d writes accepted, %d rejected", len(r.accepted), r.rejected)
}

// writeUntilLost has lk write to reg every millisecond until Lost() closes;
// the returned channel is closed when it stops.
func writeUntilLost(lk *locker.Lock, reg *fencedRegister, who string) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-lk.Lost():
				return
			case <-tick.C:
				reg.write(who, lk.Token())
			}
		}
	}()
	return done
}

// lostAt sends the time Lost() closes, or nothing if ctx ends first.
func lostAt(ctx context.Context, lk *locker.Lock) <-chan time.Time {
	ch := make(chan time.Time, 1)
	go func() {
		select {
		case <-lk.Lost():
			ch <- time.Now()
		case <-ctx.Done():
		}
	}()
	return ch
}

// holdFault takes a lock in one Locker, has a second Locker wait for it
// (if waiter), and has a third client inject the fault: Lost() must close
// within holdLostBound of the fault with cause server, the waiter (if any)
// is granted a higher token, and a fenced register fed by both never
// accepts a lower token after a higher one.
func holdFault(t *testing.T, waiter bool, heldFor, bound time.Duration, inject func(ctx context.Context, cli *clientv3.Client, k string, lease clientv3.LeaseID)) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testURL(t) + uniquePrefix(t)
	h, hd := openLocker(t, url)
	w, _ := openLocker(t, url)
	other := openTest(t, "").Client()

	lk, err := h.TryAcquire(ctx, "res", locker.WithTTL(holdTTL))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	reg := &fencedRegister{}
	holderDone := writeUntilLost(lk, reg, "holder")
	var got <-chan grant
	if waiter {
		got = waitFor(t, ctx, w, "res", holdTTL, lk)
		// The waiter is queued once its entry exists.
		waitUntil(t, 10*time.Second, "the waiter to queue", func() bool {
			r, err := other.Get(ctx, hd.MutexQueuePrefix("res"), clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && r.Count > 0
		})
	}
	k := hd.LockKey("res")
	r, err := other.Get(ctx, k)
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("lock key: %v %v", r, err)
	}
	if d := heldFor - time.Since(granted); d > 0 {
		time.Sleep(d) // the fault comes this far into the hold
	}
	lostCh := lostAt(ctx, lk)
	faultAt := time.Now()
	inject(ctx, other, k, clientv3.LeaseID(r.Kvs[0].Lease))
	var lost time.Time
	select {
	case lost = <-lostCh:
	case <-time.After(holdTTL / 2):
		t.Fatalf("Lost() did not close within %v of the fault", holdTTL/2)
	}
	<-holderDone
	lostAfter := lost.Sub(faultAt)
	if !errors.Is(lk.Err(), locker.ErrNotHeld) || !errors.Is(lk.Err(), locker.CauseServer) {
		t.Errorf("Err() = %v, want ErrNotHeld with cause %q", lk.Err(), locker.CauseServer)
	}
	if lostAfter > bound {
		t.Errorf("Lost() closed %v after the fault, want within %v", lostAfter, bound)
	}
	if err := lk.Release(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("Release after the loss: %v, want ErrNotHeld", err)
	}
	if !waiter {
		t.Logf("Lost() %v after the fault", lostAfter)
		reg.check(t, "")
		return
	}
	g := <-got
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	reg.write("waiter", g.lk.Token())
	t.Logf("after the fault: holder's Lost() %v, waiter granted %v (token %d → %d)",
		lostAfter, g.at.Sub(faultAt), lk.Token(), g.lk.Token())
	if g.lk.Token() <= lk.Token() {
		t.Errorf("new token %d not above the old %d", g.lk.Token(), lk.Token())
	}
	reg.check(t, "waiter")
	if err := g.lk.Release(ctx); err != nil {
		t.Error(err)
	}
}

// Another client deletes the lock key.
func TestHoldKeyDeleted(t *testing.T) {
	holdFault(t, true, holdSettled, holdLostBound, func(ctx context.Context, cli *clientv3.Client, k string, _ clientv3.LeaseID) {
		if r, err := cli.Delete(ctx, k); err != nil || r.Deleted != 1 {
			t.Fatalf("delete: %v %v", r, err)
		}
	})
}

// Another client deletes the lock key right after the grant, before the
// watch has caught up with the server's current revision.
func TestHoldKeyDeletedAtOnce(t *testing.T) {
	holdFault(t, true, 0, holdEarlyBound, func(ctx context.Context, cli *clientv3.Client, k string, _ clientv3.LeaseID) {
		if r, err := cli.Delete(ctx, k); err != nil || r.Deleted != 1 {
			t.Fatalf("delete: %v %v", r, err)
		}
	})
}

// An operator revokes the holder's lease: etcd deletes the key with it.
func TestHoldLeaseRevoked(t *testing.T) {
	holdFault(t, true, holdSettled, holdLostBound, func(ctx context.Context, cli *clientv3.Client, _ string, id clientv3.LeaseID) {
		if _, err := cli.Revoke(ctx, id); err != nil {
			t.Fatalf("revoke: %v", err)
		}
	})
}

// Another client overwrites the lock key with another value (and no lease,
// so nobody else can be granted it either).
func TestHoldKeyOverwritten(t *testing.T) {
	holdFault(t, false, holdSettled, holdLostBound, func(ctx context.Context, cli *clientv3.Client, k string, _ clientv3.LeaseID) {
		if _, err := cli.Put(ctx, k, "intruder"); err != nil {
			t.Fatalf("put: %v", err)
		}
	})
}

// The holder's own renewals over several TTLs, a Refresh to a new TTL (the
// key moves to a new lease), and an idempotent re-acquire by the same owner
// through another Locker (a WithOwner handover) raise no false alarm; the
// watch still reports a later delete.
func TestHoldNoFalseAlarm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	url := testURL(t) + uniquePrefix(t)
	h, hd := openLocker(t, url)
	h2, _ := openLocker(t, url)
	ttl := 2 * time.Second
	lk, err := h.TryAcquire(ctx, "res", locker.WithTTL(ttl), locker.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	k := hd.LockKey("res")
	// Package locker renews every TTL/3; over three TTLs the lock stays
	// held only through those renewals.
	select {
	case <-lk.Lost():
		t.Fatalf("false alarm during renewals: %v", lk.Err())
	case <-time.After(3 * ttl):
	}
	if r := keyOf(t, hd.Client(), k); len(r.Kvs) != 1 || uint64(r.Kvs[0].CreateRevision) != lk.Token() {
		t.Fatalf("lock not held after three TTLs: %v", r.Kvs)
	}
	if err := lk.Refresh(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	lk2, err := h2.TryAcquire(ctx, "res", locker.WithTTL(4*time.Second), locker.WithOwner("me"))
	if err != nil || lk2.Token() != lk.Token() {
		t.Fatalf("handover: %v, token %v want %d", err, lk2, lk.Token())
	}
	r := keyOf(t, hd.Client(), k)
	if len(r.Kvs) != 1 || r.Kvs[0].ModRevision == r.Kvs[0].CreateRevision {
		t.Fatalf("the key was not rewritten by the owner: %v", r.Kvs)
	}
	// The delete comes after those writes on the same watch, so a false
	// alarm caused by them would be reported instead of the delete.
	if _, err := hd.Client().Delete(ctx, k); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the watch missed the delete after the owner's own writes")
	}
	if !errors.Is(lk.Err(), locker.ErrNotHeld) || !errors.Is(lk.Err(), locker.CauseServer) {
		t.Fatalf("Err() = %v, want cause server", lk.Err())
	}
	if msg := lk.Err().Error(); !strings.Contains(msg, "deleted") {
		t.Fatalf("the loss was not the delete: %v", msg)
	}
	t.Log("renewals over three TTLs, a Refresh to a new lease and a handover: no false alarm")
}

// A watch the server cancels because the revisions it must resume from
// were compacted re-reads the key: a live grant stays watched, a gone one
// is reported.
func TestHoldWatchCompacted(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	tok, err := l.Acquire(ctx, "res", "me", holdTTL)
	if err != nil {
		t.Fatal(err)
	}
	k := l.LockKey("res")
	// Move the key to a new lease, then compact past the grant: a watch
	// from the grant's revision is cancelled at once.
	if err := l.Refresh(ctx, "res", "me", holdTTL+time.Second); err != nil {
		t.Fatal(err)
	}
	r, err := l.Client().Put(ctx, l.Prefix()+"/other", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client().Compact(ctx, r.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	stop, err := l.WatchHold("res", "me", tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	d, err := l.Client().Delete(ctx, k)
	if err != nil || d.Deleted != 1 {
		t.Fatalf("delete: %v %v", d, err)
	}
	select {
	case err := <-lost:
		// A false alarm before the delete would name an earlier revision.
		if rev := reportedRev(t, err); !errors.Is(err, driver.ErrNotHeld) || rev < d.Header.Revision {
			t.Fatalf("lost(%v), want ErrNotHeld at revision %d or later", err, d.Header.Revision)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("delete after compaction not reported")
	}
}

// reportedRev returns the revision a hold watch's error names.
func reportedRev(t *testing.T, err error) int64 {
	t.Helper()
	msg := err.Error()
	i := strings.LastIndex(msg, "at revision ")
	var rev int64
	if i < 0 {
		t.Fatalf("no revision in %q", msg)
	}
	if _, err := fmt.Sscanf(msg[i:], "at revision %d", &rev); err != nil {
		t.Fatalf("%q: %v", msg, err)
	}
	return rev
}

// WatchHold rejects bad input and works only while the Locker is open; stop
// is idempotent and silences the watch.
func TestWatchHoldInputAndStop(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	for _, c := range []struct {
		key, owner string
		token      uint64
	}{{"", "o", 1}, {"k", "", 1}, {"k", "o", 0}, {"k", "o", 1 << 63}} {
		if _, err := l.WatchHold(c.key, c.owner, c.token, func(error) {}); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("WatchHold(%q, %q, %d): %v, want ErrInvalid", c.key, c.owner, c.token, err)
		}
	}
	tok, err := l.Acquire(ctx, "k", "o", holdTTL)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	stop, err := l.WatchHold("k", "o", tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	watch := func(key string) (chan error, func()) {
		tok, err := l.Acquire(ctx, key, "o", holdTTL)
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan error, 1)
		stop, err := l.WatchHold(key, "o", tok, func(err error) { ch <- err })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		return ch, stop
	}
	lostOwn, _ := watch("own")     // released by its owner through this Locker
	lostOther, _ := watch("other") // deleted by another client
	stop()
	stop()
	if err := l.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, "own", "o"); err != nil {
		t.Fatal(err)
	}
	// The other delete comes after the releases on the shared watch
	// stream: once it is reported, reports of theirs would have come too.
	if _, err := openTest(t, "").Client().Delete(ctx, l.LockKey("other")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lostOther:
	case <-time.After(5 * time.Second):
		t.Fatal("the watch missed another client's delete")
	}
	select {
	case err := <-lost:
		t.Fatalf("stopped watch reported %v", err)
	case err := <-lostOwn:
		t.Fatalf("the owner's Release through the watching Locker was reported: %v", err)
	default:
	}
	_ = l.Close()
	if _, err := l.WatchHold("k", "o", tok, func(error) {}); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// Every hold watch of a Locker travels on one gRPC watch stream: holding
// five locks starts one stream on the server and sends five watch requests
// on it.
func TestHoldWatchesShareOneStream(t *testing.T) {
	ctx := testCtx(t)
	l, _ := openLocker(t, testURL(t)+uniquePrefix(t))
	before := serverCounts(t)
	var lks []*locker.Lock
	for i := range 5 {
		lk, err := l.TryAcquire(ctx, fmt.Sprintf("k%d", i), locker.WithTTL(holdTTL))
		if err != nil {
			t.Fatal(err)
		}
		lks = append(lks, lk)
	}
	waitUntil(t, 10*time.Second, "five watch requests", func() bool {
		return countsSince(t, before)["Watch"] >= 5
	})
	d := countsSince(t, before)
	if d["open:Watch"] != 1 || d["Watch"] != 5 {
		t.Fatalf("server saw %v watch streams and %v watch requests, want 1 and 5 (%v)", d["open:Watch"], d["Watch"], d)
	}
	for _, lk := range lks {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
