package opaquetest

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// SharedRun hands a semaphore permit (of 1) and a write hold of every key of
// names from a to b, owners taken from names, adding the handoff times to
// *h: a holds, b waits, and once queued(key, mode) reports b's request
// queued, a releases and b must be granted within HandoffMax. It then
// checks that InspectShared lists b's hold alone, with the exact owner and
// mode, for both the semaphore and the read-write lock of every key, and
// calls after(key, mode, hold) for each, where the driver checks its own
// layout (after may be nil). It returns nothing: failures end the test.
func SharedRun(t *testing.T, ctx context.Context, h *Handoffs, a, b driver.SharedLocker, names []string,
	queued func(key string, mode driver.SharedMode), after func(key string, mode driver.SharedMode, hold driver.SharedInfo)) {
	t.Helper()
	req := func(mode driver.SharedMode, owner string, wait bool) driver.SharedRequest {
		return driver.SharedRequest{Mode: mode, Owner: owner, TTL: time.Minute, Limit: 1, Wait: wait}
	}
	for i, key := range names {
		owner, next := names[(i+1)%len(names)], names[(i+2)%len(names)]
		for _, mode := range []driver.SharedMode{driver.SharedPermit, driver.SharedWrite} {
			if _, err := a.AcquireShared(ctx, key, req(mode, owner, false)); err != nil {
				t.Fatalf("%v of %q: %v", mode, key, err)
			}
			got := make(chan error, 1)
			var at time.Time
			go func() {
				_, err := b.AcquireShared(ctx, key, req(mode, next, true))
				at = time.Now()
				got <- err
			}()
			queued(key, mode)
			released := time.Now()
			if err := a.ReleaseShared(ctx, key, mode, owner); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-got:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(HandoffMax):
				t.Fatalf("%v of %q not handed over within %v", mode, key, HandoffMax)
			}
			*h = append(*h, at.Sub(released))
		}
	}
	for i, key := range names {
		next := names[(i+2)%len(names)]
		for _, mode := range []driver.SharedMode{driver.SharedPermit, driver.SharedRead} {
			hs, err := a.InspectShared(ctx, key, mode)
			want := driver.SharedPermit
			if mode.RW() {
				want = driver.SharedWrite
			}
			if err != nil || len(hs) != 1 || hs[0].Owner != next || hs[0].Mode != want {
				t.Fatalf("InspectShared(%q, %v) = %+v, %v; want %q alone, %v", key, mode, hs, err, next, want)
			}
			if after != nil {
				after(key, want, hs[0])
			}
		}
	}
}
