package locker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

var errTransient = errors.New("transient: connection reset")

// faulty wraps a mem Locker and injects faults. Its zero hooks pass through.
type faulty struct {
	driver.Locker
	acquires, refreshes, subscribes, releases atomic.Int64
	// lostReplies makes that many Acquire calls perform the grant and then
	// report errTransient.
	lostReplies atomic.Int64
	// failReleases makes that many Release calls fail with errTransient
	// without reaching the server.
	failReleases atomic.Int64

	mu sync.Mutex
	// failRefresh, when set, makes Refresh return it without reaching the
	// server; with failRefreshTTL set, only the refreshes with that TTL.
	failRefresh    error
	failRefreshTTL time.Duration
	// paused, when set, makes Refresh block until its context is done, as
	// a renewal stuck on a server that does not answer.
	paused bool
	// lostReply makes Acquire perform the grant and then report
	// errTransient, as when the reply is lost.
	lostReply bool
	// failAcquire, when set, fails Acquire calls beyond the first failAfter.
	failAcquire error
	failAfter   int64
}

func newFaulty(s *mem.Store) *faulty { return &faulty{Locker: s.Locker()} }

// setFailAcquire makes every Acquire after the first `after` calls fail with
// err.
func (f *faulty) setFailAcquire(err error, after int64) {
	f.mu.Lock()
	f.failAcquire, f.failAfter = err, after
	f.mu.Unlock()
}

func (f *faulty) setFailRefresh(err error) {
	f.mu.Lock()
	f.failRefresh = err
	f.mu.Unlock()
}

// pauseRefresh makes every Refresh block until its context is done.
func (f *faulty) pauseRefresh(on bool) {
	f.mu.Lock()
	f.paused = on
	f.mu.Unlock()
}

func (f *faulty) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	n := f.acquires.Add(1)
	f.mu.Lock()
	ferr, after := f.failAcquire, f.failAfter
	f.mu.Unlock()
	if ferr != nil && n > after {
		return 0, ferr
	}
	tok, err := f.Locker.Acquire(ctx, key, owner, ttl)
	f.mu.Lock()
	lost := f.lostReply
	f.mu.Unlock()
	if err == nil && lost {
		return 0, errTransient
	}
	if err == nil && f.lostReplies.Add(-1) >= 0 {
		return 0, errTransient
	}
	return tok, err
}

func (f *faulty) Release(ctx context.Context, key, owner string) error {
	f.releases.Add(1)
	if f.failReleases.Add(-1) >= 0 {
		return errTransient
	}
	return f.Locker.Release(ctx, key, owner)
}

func (f *faulty) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	f.refreshes.Add(1)
	f.mu.Lock()
	err, only, paused := f.failRefresh, f.failRefreshTTL, f.paused
	f.mu.Unlock()
	if paused {
		<-ctx.Done()
		return ctx.Err()
	}
	if err != nil && (only == 0 || only == ttl) {
		return err
	}
	return f.Locker.Refresh(ctx, key, owner, ttl)
}

func (f *faulty) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return f.Locker.(driver.Inspector).Inspect(ctx, key)
}

// waiting adds the mem Waiter to a faulty driver, counting subscriptions.
type waiting struct{ *faulty }

func (w waiting) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	w.subscribes.Add(1)
	return w.Locker.(driver.Waiter).Subscribe(ctx, key)
}

// blocking turns a mem Locker into a driver.BlockingAcquirer, as a server
// with a lock manager would be.
type blocking struct {
	*faulty
	waits atomic.Int64
}

func (b *blocking) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	b.waits.Add(1)
	wake, cancel, err := b.Locker.(driver.Waiter).Subscribe(ctx, key)
	if err != nil {
		return 0, err
	}
	defer cancel()
	for {
		tok, err := b.Locker.Acquire(ctx, key, owner, ttl)
		var held *driver.HeldError
		if !errors.As(err, &held) {
			return tok, err
		}
		t := time.NewTimer(held.Remaining)
		select {
		case <-wake:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return 0, ctx.Err()
		}
		t.Stop()
	}
}

// capable reports capabilities like etcd's.
type capable struct {
	driver.Locker
	caps driver.Capabilities
}

func (c capable) Capabilities() driver.Capabilities { return c.caps }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func waitClosed(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not happen within %v", what, d)
	}
}

func mustOpen(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s", what)
	default:
	}
}

// watching adds a driver.HoldWatcher to a driver whose losses the test
// reports by hand, standing for a backend that sees a session end or a key
// deleted.
type watching struct {
	driver.Locker
	mu      sync.Mutex
	watches map[string]func(error) // by owner
	stops   atomic.Int64
}

func (w *watching) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.watches == nil {
		w.watches = map[string]func(error){}
	}
	w.watches[owner] = lost
	return func() { w.stops.Add(1) }, nil
}

// fire reports owner's lock as lost, as the backend would.
func (w *watching) fire(owner string, err error) bool {
	w.mu.Lock()
	lost := w.watches[owner]
	w.mu.Unlock()
	if lost == nil {
		return false
	}
	lost(err)
	return true
}

// fastClock stands for a server whose clock runs four times as fast as the
// holder's: every TTL it is sent is a quarter as long on the server, so a
// lock expires there before the holder's first renewal (at TTL/3) reaches
// it, and long before the holder's safe deadline.
type fastClock struct {
	driver.Locker
}

func (f fastClock) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return f.Locker.Acquire(ctx, key, owner, ttl/4)
}

func (f fastClock) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return f.Locker.Refresh(ctx, key, owner, ttl/4)
}

// waitFor polls cond every millisecond until it holds, failing the test
// after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// lostOnTime waits for lk's Lost, acquired at start with ttl and never
// renewed since, and checks that it closed at the safe deadline: no earlier
// than ttl − ttl/100 − 2ms after start, and before ttl.
func lostOnTime(t *testing.T, lk *locker.Lock, start time.Time, ttl time.Duration) {
	t.Helper()
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	seen := time.Now()
	// Lost closes at the lock's safe deadline, which must fall before the
	// TTL counted from the acquire's start. The goroutine that sees it may
	// run late on a loaded machine: it must not see it before the
	// deadline, nor more than lostSeenLate after it.
	deadline := lk.Deadline()
	if !deadline.Before(start.Add(ttl)) {
		t.Fatalf("safe deadline %v after acquire, not before the TTL %v", deadline.Sub(start), ttl)
	}
	if deadline.Sub(start) < ttl-ttl/100-2*time.Millisecond-time.Millisecond {
		t.Fatalf("safe deadline %v after acquire, earlier than TTL − TTL/100 − 2ms", deadline.Sub(start))
	}
	if seen.Before(deadline) {
		t.Fatalf("Lost closed %v after acquire, before the safe deadline %v", seen.Sub(start), deadline.Sub(start))
	}
	if late := seen.Sub(deadline); late > lostSeenLate {
		t.Fatalf("Lost seen %v after the safe deadline", late)
	}
}

// lostSeenLate is how long after a lock's safe deadline the test may see
// its Lost closed: the time a loaded 2-core machine may take to run the
// goroutine that waits for it.
const lostSeenLate = 250 * time.Millisecond
