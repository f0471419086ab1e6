package locker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// batchRec is a mem driver that records every RefreshBatch call, and
// stalls (until its ctx ends) the batches that name the key stall.
type batchRec struct {
	driver.Locker
	br    driver.BatchRefresher
	stall string

	mu      sync.Mutex
	batches []recBatch
	stalled int // batches stalled so far
	changed chan struct{}
}

// recBatch is one recorded batch: its keys, and each item's result.
type recBatch struct {
	keys []string
	errs []error
}

func newBatchRec(st *mem.Store) *batchRec {
	d := st.Locker()
	return &batchRec{Locker: d, br: d.(driver.BatchRefresher), changed: make(chan struct{})}
}

func (b *batchRec) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	keys := make([]string, len(items))
	for i, it := range items {
		keys[i] = it.Key
	}
	if b.stall != "" && slices.Contains(keys, b.stall) {
		b.mu.Lock()
		b.stalled++
		b.mu.Unlock()
		<-ctx.Done()
		errs := make([]error, len(items))
		for i := range errs {
			errs[i] = ctx.Err()
		}
		return errs
	}
	errs := b.br.RefreshBatch(ctx, items)
	b.mu.Lock()
	b.batches = append(b.batches, recBatch{keys, errs})
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
	return errs
}

// waitBatch waits until a recorded batch satisfies ok, and returns it.
func (b *batchRec) waitBatch(t *testing.T, d time.Duration, what string, ok func(recBatch) bool) recBatch {
	t.Helper()
	until := time.After(d)
	for {
		b.mu.Lock()
		for _, x := range b.batches {
			if ok(x) {
				b.mu.Unlock()
				return x
			}
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-until:
			t.Fatalf("no batch %s within %v", what, d)
		}
	}
}

// In one batch of five renewals, one lock's key was deleted and another's
// taken by another owner: only those two are lost, each with its own cause
// (expired, taken), and the other three stay held and keep renewing.
func TestBatchIsolation(t *testing.T) {
	st := mem.NewStore()
	rec := newBatchRec(st)
	l := locker.New(rec)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	pending, release := locker.HoldBatches(l)
	ttl := 3 * time.Second
	keys := []string{"a", "deleted", "c", "taken", "e"}
	locks := map[string]*locker.Lock{}
	for _, k := range keys {
		lk, err := l.Acquire(ctx, k, locker.WithTTL(ttl), locker.WithOwner("owner-"+k))
		if err != nil {
			t.Fatal(err)
		}
		locks[k] = lk
	}
	// The first renewals (due at TTL/3) wait in one pending batch.
	for until := time.Now().Add(10 * time.Second); pending() < len(keys); {
		if time.Now().After(until) {
			t.Fatalf("%d of %d renewals pending", pending(), len(keys))
		}
		time.Sleep(time.Millisecond)
	}
	raw := st.Locker()
	if err := raw.Release(ctx, "deleted", "owner-deleted"); err != nil {
		t.Fatal(err)
	}
	if err := raw.Release(ctx, "taken", "owner-taken"); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Acquire(ctx, "taken", "intruder", time.Minute); err != nil {
		t.Fatal(err)
	}
	release()
	first := rec.waitBatch(t, 10*time.Second, "of all five", func(b recBatch) bool { return len(b.keys) == len(keys) })
	for i, k := range first.keys {
		if bad := k == "deleted" || k == "taken"; bad != errors.Is(first.errs[i], driver.ErrNotHeld) {
			t.Fatalf("batch result for %s: %v", k, first.errs[i])
		}
	}
	waitClosed(t, locks["deleted"].Lost(), 5*time.Second, "Lost of the deleted lock")
	waitClosed(t, locks["taken"].Lost(), 5*time.Second, "Lost of the taken lock")
	if err := locks["deleted"].Err(); !errors.Is(err, locker.CauseExpired) || !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("deleted lock: Err = %v, want CauseExpired", err)
	}
	if err := locks["taken"].Err(); !errors.Is(err, locker.CauseTaken) || !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("taken lock: Err = %v, want CauseTaken", err)
	}
	// The next round renews the other three, together, and they stay held.
	survivors := []string{"a", "c", "e"}
	rec.waitBatch(t, 10*time.Second, "renewing a, c and e", func(b recBatch) bool {
		n := 0
		for i, k := range b.keys {
			if slices.Contains(survivors, k) && b.errs[i] == nil {
				n++
			}
		}
		return n == len(survivors) && len(b.keys) == len(survivors)
	})
	for _, k := range survivors {
		mustOpen(t, locks[k].Lost(), k+" lost")
		if _, err := raw.Acquire(ctx, k, "intruder", ttl); !errors.Is(err, locker.ErrNotAcquired) {
			t.Fatalf("intruder on %s: %v", k, err)
		}
		if err := locks[k].Release(ctx); err != nil {
			t.Fatalf("release %s: %v", k, err)
		}
	}
}

// A batch whose round trip stalls past a lock's safe deadline: that lock's
// Lost closes at its deadline (before its TTL runs out on the server), not
// when the batch returns, and a lock of the same Locker whose renewals do
// not stall stays held.
func TestBatchStallLosesOnTime(t *testing.T) {
	st := mem.NewStore()
	rec := newBatchRec(st)
	rec.stall = "stalled"
	l := locker.New(rec)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := time.Second
	start := time.Now()
	lk, err := l.Acquire(ctx, "stalled", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.Acquire(ctx, "other", locker.WithTTL(3*ttl))
	if err != nil {
		t.Fatal(err)
	}
	lostOnTime(t, lk, start, ttl)
	if err := lk.Err(); !errors.Is(err, locker.CauseDeadline) {
		t.Fatalf("Err = %v, want CauseDeadline", err)
	}
	rec.mu.Lock()
	stalled := rec.stalled
	rec.mu.Unlock()
	if stalled == 0 {
		t.Fatal("no batch stalled")
	}
	// The other lock renews (every TTL) through batches of its own.
	rec.waitBatch(t, 10*time.Second, "renewing the other lock", func(b recBatch) bool {
		return len(b.keys) == 1 && b.keys[0] == "other" && b.errs[0] == nil
	})
	mustOpen(t, other.Lost(), "the other lock was lost")
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
