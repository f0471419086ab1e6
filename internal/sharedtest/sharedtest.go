// Package sharedtest holds the shared-hold (driver.SharedLocker) scenarios
// that several drivers' tests run: writer starvation, a crashed permit
// holder's permit coming back, and opaque keys and owners handed over. Each
// driver supplies how it opens Lockers and how it sees a queued request.
// It is imported by test code only.
package sharedtest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/opaquetest"
)

// Req is a SharedRequest.
func Req(mode driver.SharedMode, owner string, ttl time.Duration, n int, wait bool) driver.SharedRequest {
	return driver.SharedRequest{Mode: mode, Owner: owner, TTL: ttl, Limit: n, Wait: wait}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// waitUntil polls cond until it holds, failing t after 10s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after 10s waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}

// WriterStarvation: 8 readers, each on a Locker of its own from open,
// loop (acquire, 2ms, release) on a read-write lock of a fresh key; a writer
// that starts waiting is granted within the bound with no reader beside
// it, and the readers resume after its release.
func WriterStarvation(t *testing.T, open func() driver.SharedLocker, within time.Duration) {
	ctx := ctxT(t)
	key := fmt.Sprintf("catalog/%d", time.Now().UnixNano()) // a key no earlier run left behind
	var reads, holding atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		l := open()
		owner := fmt.Sprint("reader", i)
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := l.AcquireShared(ctx, key, Req(driver.SharedRead, owner, time.Minute, 0, true)); err != nil {
					errs <- err
					return
				}
				holding.Add(1)
				reads.Add(1)
				time.Sleep(2 * time.Millisecond)
				holding.Add(-1)
				if err := l.ReleaseShared(ctx, key, driver.SharedRead, owner); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}()
	waitUntil(t, "32 reads", func() bool { return reads.Load() >= 32 })
	w := open()
	start := time.Now()
	if _, err := w.AcquireShared(ctx, key, Req(driver.SharedWrite, "writer", time.Minute, 0, true)); err != nil {
		t.Fatalf("the writer, after %v of readers looping: %v", time.Since(start), err)
	}
	waited := time.Since(start)
	if n := holding.Load(); n != 0 {
		t.Errorf("%d readers hold beside the writer", n)
	}
	before := reads.Load()
	if err := w.ReleaseShared(ctx, key, driver.SharedWrite, "writer"); err != nil {
		t.Fatal(err)
	}
	t.Logf("the writer waited %v among 8 looping readers (%d reads before it)", waited, before)
	if waited > within {
		t.Errorf("the writer waited %v, want within %v", waited, within)
	}
	waitUntil(t, "the readers to resume", func() bool { return reads.Load() >= before+8 })
}

// CrashReturned checks the end of a crash: owner "child" holding a permit
// of key beside "parent" (both through a) has just been killed, and
// granted receives the time a waiter for that permit was granted. The
// permit must come back within 100ms after the child's lease ends, not
// before, and the parent keep its own.
func CrashReturned(t *testing.T, a driver.SharedLocker, key string, granted <-chan time.Time) {
	t.Helper()
	ctx := ctxT(t)
	t0 := time.Now()
	hs, err := a.InspectShared(ctx, key, driver.SharedPermit)
	t1 := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(hs, func(h driver.SharedInfo) bool { return h.Owner == "child" })
	if i < 0 || len(hs) != 2 {
		t.Fatalf("holders after the kill: %+v, want the parent and the child", hs)
	}
	// A lease reported with a whole number of ms left may end up to 1ms
	// after that.
	earliest, latest := t0.Add(hs[i].Remaining), t1.Add(hs[i].Remaining+time.Millisecond)
	at := <-granted
	if at.Before(earliest) || at.After(latest.Add(100*time.Millisecond)) {
		t.Fatalf("the dead child's permit came back %v after its lease ended, want within [0, 100ms]", at.Sub(earliest))
	}
	t.Logf("the permit came back %v after the dead child's lease ended", at.Sub(earliest))
	if err := a.RefreshShared(ctx, key, driver.SharedPermit, "parent", time.Minute); err != nil {
		t.Fatalf("the parent lost its permit with the child's: %v", err)
	}
}

// Opaque runs opaquetest.SharedRun over opaquetest.Names from a to b,
// queued reporting b's request queued, and checks the handoff times.
func Opaque(t *testing.T, a, b driver.SharedLocker, queued func(key string, mode driver.SharedMode)) {
	var ho opaquetest.Handoffs
	defer func() { ho.Check(t) }()
	opaquetest.SharedRun(t, ctxT(t), &ho, a, b, opaquetest.Names, queued, nil)
}
