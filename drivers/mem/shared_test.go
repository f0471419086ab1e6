package mem

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

type result struct {
	i     int
	token uint64
	err   error
}

// queued waits until key's lock in mode has n queued requests.
func queued(t *testing.T, s *Store, key string, mode driver.SharedMode, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		sl := s.shared[sharedID{rw: mode.RW(), key: key}]
		got := 0
		if sl != nil {
			got = len(sl.queue)
		}
		s.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func shared(s *Store) driver.SharedLocker { return s.Locker().(driver.SharedLocker) }

func rq(mode driver.SharedMode, owner string, n int, wait bool) driver.SharedRequest {
	return driver.SharedRequest{Mode: mode, Owner: owner, TTL: time.Minute, Limit: n, Wait: wait}
}

// waitAsync starts a waiting request whose result arrives on out.
func waitAsync(ctx context.Context, d driver.SharedLocker, key string, i int, r driver.SharedRequest, out chan<- result) {
	go func() {
		tok, err := d.AcquireShared(ctx, key, r)
		out <- result{i, tok, err}
	}()
}

func next(t *testing.T, out <-chan result) result {
	t.Helper()
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("waiter %d: %v", r.i, r.err)
		}
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no waiter granted")
	}
	return result{}
}

func none(t *testing.T, out <-chan result) {
	t.Helper()
	select {
	case r := <-out:
		t.Fatalf("waiter %d granted (%v) while it cannot be", r.i, r.err)
	default:
	}
}

// Waiters for a permit are granted one per release, in arrival order.
func TestSharedFIFO(t *testing.T) {
	s := NewStore()
	d := shared(s)
	ctx := context.Background()
	if _, err := d.AcquireShared(ctx, "k", rq(driver.SharedPermit, "h", 1, false)); err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 5)
	for i := range 5 {
		waitAsync(ctx, shared(s), "k", i, rq(driver.SharedPermit, string(rune('a'+i)), 1, true), out)
		queued(t, s, "k", driver.SharedPermit, i+1)
	}
	holder := "h"
	for i := range 5 {
		if err := d.ReleaseShared(ctx, "k", driver.SharedPermit, holder); err != nil {
			t.Fatal(err)
		}
		r := next(t, out)
		if r.i != i {
			t.Fatalf("release %d granted waiter %d, want %d (FIFO)", i, r.i, i)
		}
		none(t, out)
		queued(t, s, "k", driver.SharedPermit, 4-i)
		holder = string(rune('a' + i))
	}
	_ = d.ReleaseShared(ctx, "k", driver.SharedPermit, holder)
	if len(s.shared) != 0 {
		t.Fatalf("the store keeps %d empty locks", len(s.shared))
	}
}

// A release grants the run of readers at the head of the queue and no
// more: the writer behind them and the reader behind the writer wait.
func TestSharedWakesOnlyGrantable(t *testing.T) {
	s := NewStore()
	d := shared(s)
	ctx := context.Background()
	if _, err := d.AcquireShared(ctx, "k", rq(driver.SharedWrite, "w0", 0, false)); err != nil {
		t.Fatal(err)
	}
	out := make(chan result, 4)
	modes := []driver.SharedMode{driver.SharedRead, driver.SharedRead, driver.SharedWrite, driver.SharedRead}
	owners := []string{"r1", "r2", "w1", "r3"}
	for i, m := range modes {
		waitAsync(ctx, shared(s), "k", i, rq(m, owners[i], 0, true), out)
		queued(t, s, "k", m, i+1)
	}
	release := func(mode driver.SharedMode, owner string) {
		t.Helper()
		if err := d.ReleaseShared(ctx, "k", mode, owner); err != nil {
			t.Fatal(err)
		}
	}
	release(driver.SharedWrite, "w0")
	got := map[int]bool{next(t, out).i: true, next(t, out).i: true}
	if !got[0] || !got[1] {
		t.Fatalf("the writer's release granted %v, want the two readers at the head", got)
	}
	none(t, out)
	release(driver.SharedRead, "r1")
	none(t, out)
	release(driver.SharedRead, "r2")
	w := next(t, out)
	if w.i != 2 {
		t.Fatalf("granted waiter %d, want the writer", w.i)
	}
	none(t, out)
	release(driver.SharedWrite, "w1")
	if r := next(t, out); r.i != 3 || r.token <= w.token {
		t.Fatalf("granted waiter %d with token %d, want the last reader above the writer's %d", r.i, r.token, w.token)
	}
}

// A waiting writer that gives up lets the readers queued behind it in at
// once, and leaves nothing behind.
func TestSharedAbandonedWriter(t *testing.T) {
	s := NewStore()
	d := shared(s)
	ctx := context.Background()
	if _, err := d.AcquireShared(ctx, "k", rq(driver.SharedRead, "r0", 0, false)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	out := make(chan result, 2)
	waitAsync(wctx, shared(s), "k", 0, rq(driver.SharedWrite, "w", 0, true), out)
	queued(t, s, "k", driver.SharedWrite, 1)
	waitAsync(ctx, shared(s), "k", 1, rq(driver.SharedRead, "r1", 0, true), out)
	queued(t, s, "k", driver.SharedRead, 2)
	cancel()
	first, second := <-out, <-out
	if first.i == 1 {
		first, second = second, first
	}
	if !errors.Is(first.err, context.Canceled) || second.err != nil {
		t.Fatalf("writer: %v, reader: %v; want Canceled and a grant", first.err, second.err)
	}
	hs, _ := d.InspectShared(ctx, "k", driver.SharedRead)
	if len(hs) != 2 || hs[0].Owner != "r0" || hs[1].Owner != "r1" {
		t.Fatalf("holders %+v, want the two readers", hs)
	}
	queued(t, s, "k", driver.SharedRead, 0)
}

// An expiry grants the waiter at the head: the monotonic-clock timer of the
// expired hold wakes it, not a poll.
func TestSharedExpiryGrants(t *testing.T) {
	s := NewStore()
	d := shared(s)
	ctx := context.Background()
	r := rq(driver.SharedPermit, "crashed", 1, false)
	r.TTL = 50 * time.Millisecond
	start := time.Now()
	if _, err := d.AcquireShared(ctx, "k", r); err != nil {
		t.Fatal(err)
	}
	if _, err := shared(s).AcquireShared(ctx, "k", rq(driver.SharedPermit, "next", 1, true)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 150*time.Millisecond {
		t.Fatalf("granted %v after a 50ms hold", d)
	}
}
