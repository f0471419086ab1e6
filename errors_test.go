package locker_test

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
	"github.com/go-locker/locker/drivers/mem"
)

// errDown is what a driver returns when its server cannot be reached.
var errDown = fmt.Errorf("dial tcp 127.0.0.1:1: connect: connection refused: %w", driver.ErrUnavailable)

// down wraps a mem Locker whose "server" can be switched off: every call
// then fails with errDown.
type down struct {
	driver.Locker
	off      atomic.Bool
	acquires atomic.Int64
}

func (d *down) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	d.acquires.Add(1)
	if d.off.Load() {
		return 0, errDown
	}
	return d.Locker.Acquire(ctx, key, owner, ttl)
}

func (d *down) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if d.off.Load() {
		return errDown
	}
	return d.Locker.Refresh(ctx, key, owner, ttl)
}

func (d *down) Release(ctx context.Context, key, owner string) error {
	if d.off.Load() {
		return errDown
	}
	return d.Locker.Release(ctx, key, owner)
}

func (d *down) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if d.off.Load() {
		return driver.Info{}, errDown
	}
	return d.Locker.(driver.Inspector).Inspect(ctx, key)
}

func (d *down) Ping(context.Context) error {
	if d.off.Load() {
		return errDown
	}
	return nil
}

type downDriver struct{}

func (downDriver) Open(string) (driver.Locker, error) { return nil, fmt.Errorf("zz-down: %w", errDown) }

var registerDown sync.Once

func isUnavailable(err error) bool {
	return errors.Is(err, locker.ErrUnavailable) && errors.Is(err, driver.ErrUnavailable)
}

// ErrUnavailable surfaces through every layer as the doc of
// locker.ErrUnavailable says: at Open, at once from TryAcquire and the
// first attempt of Acquire and Do, as a transient error once Acquire is
// waiting, from Refresh, Release, Inspect and Ping, and as a presumed loss
// (CauseDeadline) when renewals cannot reach the server.
func TestErrUnavailableThroughEveryLayer(t *testing.T) {
	registerDown.Do(func() { locker.Register("zz-test-down", downDriver{}) })
	if _, err := locker.Open("zz-test-down", ""); !isUnavailable(err) {
		t.Errorf("Open: %v", err)
	}
	if _, err := locker.OpenURL("zz-test-down://h"); !isUnavailable(err) {
		t.Errorf("OpenURL: %v", err)
	}

	st := mem.NewStore()
	d := &down{Locker: st.Locker()}
	l := locker.New(d)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)

	d.off.Store(true)
	if _, err := l.TryAcquire(ctx, "k"); !isUnavailable(err) {
		t.Errorf("TryAcquire: %v", err)
	}
	start := time.Now()
	if _, err := l.Acquire(ctx, "k"); !isUnavailable(err) {
		t.Errorf("Acquire: %v", err)
	}
	if err := l.Do(ctx, "k", func(context.Context) error { t.Error("fn ran"); return nil }); !isUnavailable(err) {
		t.Errorf("Do: %v", err)
	}
	if n := d.acquires.Load(); n != 3 {
		t.Errorf("%d attempts by TryAcquire, Acquire and Do on a backend that is down, want 3", n)
	}
	if e := time.Since(start); e > time.Second {
		t.Errorf("Acquire and Do took %v to fail on a backend that is down", e)
	}
	if _, err := l.Inspect(ctx, "k"); !isUnavailable(err) {
		t.Errorf("Inspect: %v", err)
	}
	if err := l.Ping(ctx); !isUnavailable(err) {
		t.Errorf("Ping: %v", err)
	}

	// A held lock: Refresh and Release say so, and Release can be retried.
	d.off.Store(false)
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	d.off.Store(true)
	if err := lk.Refresh(ctx, time.Minute); !isUnavailable(err) {
		t.Errorf("Refresh: %v", err)
	}
	if err := lk.Release(ctx); !isUnavailable(err) {
		t.Errorf("Release: %v", err)
	}
	d.off.Store(false)
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("retried Release: %v", err)
	}

	// Waiting: the backend goes down after the first attempt found the key
	// held; the wait goes on until its context ends.
	if _, err := st.Locker().Acquire(ctx, "w", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	before := d.acquires.Load()
	go func() {
		_, err := l.Acquire(wctx, "w")
		errc <- err
	}()
	waitFor(t, 10*time.Second, "the first attempt", func() bool { return d.acquires.Load() > before })
	d.off.Store(true)
	err = <-errc
	if !isUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waiting Acquire: %v, want the deadline and ErrUnavailable", err)
	}
	if n := d.acquires.Load() - before; n < 3 {
		t.Errorf("%d attempts while waiting on a backend that is down: not retried", n)
	}

	// Renewals that cannot reach the server: a presumed loss.
	d.off.Store(false)
	lk, err = l.Acquire(ctx, "r", locker.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	d.off.Store(true)
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	if !errors.Is(lk.Err(), locker.CauseDeadline) {
		t.Errorf("Err() = %v", lk.Err())
	}
	d.off.Store(false)
}
