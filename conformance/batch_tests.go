package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// A batch refreshes exactly the locks it names whose owners hold them: two
// of the caller's locks get the batch's TTL, counted from the batch;
// another owner's lock, a released lock and a key never taken get
// ErrNotHeld, and are neither extended nor created; an item with an empty
// key gets ErrInvalid; a lock of the same owner the batch does not name
// keeps its TTL. Each item's result stands on its own, in the order of the
// items. An empty batch returns no results; a batch with a done context,
// or after Close, fails every item.
func (s *suite) driverBatchRefresh(t *testing.T) {
	a, b := s.open(t), s.open(t)
	br := a.(driver.BatchRefresher)
	if errs := br.RefreshBatch(s.callCtx(t), nil); len(errs) != 0 {
		t.Fatalf("RefreshBatch of no items: %d results, want none", len(errs))
	}
	// The caller's two locks are taken for longer than the subtest runs,
	// and the batch shortens them (a TTL replaces the one in force): only
	// the batch can make them expire in time, however slow the machine.
	// The locks the batch must not change are taken last, just before it,
	// with a TTL the batch's would lengthen.
	hold, medium, long := ttlFor(a, s.hold()), ttlFor(a, s.medium()), ttlFor(a, s.long())
	o := newOwner()
	k1, k2, foreign, gone, never, bystander := newKey(t), newKey(t), newKey(t), newKey(t), newKey(t), newKey(t)
	s.acquire(t, a, gone, o, hold)
	if err := a.Release(s.callCtx(t), gone, o); err != nil {
		t.Fatalf("Release: %v", err)
	}
	s.acquire(t, a, k1, o, hold)
	s.acquire(t, a, k2, o, hold)
	gf := s.acquire(t, b, foreign, newOwner(), medium)
	gb := s.acquire(t, a, bystander, o, medium)
	items := []driver.RefreshItem{
		{Key: k1, Owner: o, TTL: long}, {Key: foreign, Owner: o, TTL: long}, {Key: "", Owner: o, TTL: long},
		{Key: gone, Owner: o, TTL: long}, {Key: k2, Owner: o, TTL: long}, {Key: never, Owner: o, TTL: long},
	}
	want := []error{nil, driver.ErrNotHeld, driver.ErrInvalid, driver.ErrNotHeld, nil, driver.ErrNotHeld}
	what := []string{"a held lock", "another owner's lock", "an empty key", "a released lock", "a second held lock", "a key never taken"}
	sent := time.Now()
	errs := br.RefreshBatch(s.callCtx(t), items)
	returned := time.Now()
	if len(errs) != len(items) {
		t.Fatalf("RefreshBatch of %d items: %d results", len(items), len(errs))
	}
	for i, err := range errs {
		switch {
		case want[i] == nil && err != nil:
			t.Fatalf("RefreshBatch item %d (%s): %v", i, what[i], err)
		case want[i] != nil:
			wantErr(t, "RefreshBatch item for "+what[i], err, want[i])
		}
	}
	s.mustBeFree(t, b, gone, "after a batch named a released lock")
	s.mustBeFree(t, b, never, "after a batch named a key never taken")
	g := func(key string) grant { return grant{key: key, sent: sent, returned: returned, ttl: s.effective(long)} }
	s.expectExpiry(t, b,
		expiry{g: g(k1), what: "a lock a batch refreshed"},
		expiry{g: g(k2), what: "a second lock the same batch refreshed"},
		expiry{g: gf, what: "another owner's lock a batch named (it must not be extended)"},
		expiry{g: gb, what: "a lock of the same owner the batch did not name"})
	s.batchFailsWhole(t, a, o)
}

// batchFailsWhole checks that a batch with a done context, or through a
// closed Locker, fails every item, promptly.
func (s *suite) batchFailsWhole(t *testing.T, a driver.Locker, o string) {
	br := a.(driver.BatchRefresher)
	key, ttl := newKey(t), ttlFor(a, s.hold())
	s.acquire(t, a, key, o, ttl)
	items := []driver.RefreshItem{{Key: key, Owner: o, TTL: ttl}, {Key: newKey(t), Owner: o, TTL: ttl}}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var errs []error
	within(t, quick, "RefreshBatch with a done context", func() { errs = br.RefreshBatch(done, items) })
	if len(errs) != len(items) {
		t.Fatalf("RefreshBatch with a done context: %d results for %d items", len(errs), len(items))
	}
	for _, err := range errs {
		wantErr(t, "RefreshBatch item with a done context", err, context.Canceled)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	within(t, quick, "RefreshBatch after Close", func() { errs = br.RefreshBatch(s.callCtx(t), items) })
	if len(errs) != len(items) {
		t.Fatalf("RefreshBatch after Close: %d results for %d items", len(errs), len(items))
	}
	for _, err := range errs {
		wantErr(t, "RefreshBatch item after Close", err, driver.ErrClosed)
	}
}
