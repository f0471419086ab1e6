package locker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker/driver"
)

// MaxSemaphoreLimit is the largest n a Semaphore accepts
// (driver.MaxSharedLimit). A larger n, or one below 1, makes every call
// fail with ErrInvalid before any I/O.
const MaxSemaphoreLimit = driver.MaxSharedLimit

// holdOps refreshes and releases a grant on the server: the driver's mutex
// calls (driver.Locker), or a shared hold's (sharedOps).
type holdOps interface {
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error
	Release(ctx context.Context, key, owner string) error
}

// sharedOps routes a Lock's Refresh and Release to the driver's
// SharedLocker, for a hold in mode.
type sharedOps struct {
	s    driver.SharedLocker
	mode driver.SharedMode
}

func (o *sharedOps) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return o.s.RefreshShared(ctx, key, o.mode, owner, ttl)
}

func (o *sharedOps) Release(ctx context.Context, key, owner string) error {
	return o.s.ReleaseShared(ctx, key, o.mode, owner)
}

// sharedLocker returns the driver's SharedLocker, or an error matching
// errors.ErrUnsupported that names the driver: it lacks the interface, or
// its configuration refuses shared holds (driver.SharedRefuser).
func (l *Locker) sharedLocker() (driver.SharedLocker, error) {
	if s, ok := l.drv.(driver.SharedLocker); ok {
		if r, ok := l.drv.(driver.SharedRefuser); ok {
			if err := r.SharedUnsupported(); err != nil {
				return nil, err
			}
		}
		return s, nil
	}
	return nil, fmt.Errorf("driver %T has no semaphores or read-write locks (driver.SharedLocker): %w", l.drv, errors.ErrUnsupported)
}

func checkLimit(n int) error {
	if n < 1 || n > MaxSemaphoreLimit {
		return fmt.Errorf("%w: semaphore limit must be 1 to %d, got %d", ErrInvalid, MaxSemaphoreLimit, n)
	}
	return nil
}

// acquireShared is the Acquire (wait) and TryAcquire of a semaphore permit
// or a side of a read-write lock, with the span and metrics of an acquire.
func (l *Locker) acquireShared(ctx context.Context, key string, mode driver.SharedMode, n int, opts []Option, wait bool) (*Lock, error) {
	t := l.tel
	var op acquireOp
	if t != nil {
		ctx, op = t.startAcquire(ctx, key, wait)
	}
	var lk *Lock
	sh, err := l.sharedLocker()
	if err == nil && mode == driver.SharedPermit {
		err = checkLimit(n)
	}
	var o options
	if err == nil {
		o, err = l.prepare(key, opts)
	}
	if err == nil {
		o.attrs = op.attrs
		o.hold = &sharedOps{s: sh, mode: mode}
		req := driver.SharedRequest{Mode: mode, Owner: o.owner, TTL: o.ttl, Limit: n, Wait: wait}
		var cctx context.Context
		var done func(error) error
		if cctx, done, err = l.begin(ctx, l.life); err == nil {
			lk, err = l.grantShared(cctx, sh, key, req, o)
			err = done(err)
		}
	}
	err = wrap(ctx, "acquire "+mode.String(), key, err)
	if t != nil {
		t.endAcquire(ctx, op, lk, err)
	}
	return lk, err
}

// grantShared asks the driver for the hold and adopts the grant. It runs as
// a call in flight (Locker.begin), so Close cuts a wait short and waits for
// it. A grant that came late in a long wait is refreshed first, so that the
// safe deadline counts from a call whose start is known.
func (l *Locker) grantShared(ctx context.Context, sh driver.SharedLocker, key string, req driver.SharedRequest, o options) (*Lock, error) {
	if req.Wait {
		l.tel.waitEvent(ctx, "server")
	}
	for {
		start := time.Now()
		dctx, end := l.tel.child(ctx, "locker.driver.acquire_shared")
		token, err := sh.AcquireShared(dctx, key, req)
		end(err)
		if err == nil && req.Wait && time.Since(start) > req.TTL/4 {
			start = time.Now()
			dctx, end := l.tel.child(ctx, "locker.driver.refresh")
			err = sh.RefreshShared(dctx, key, req.Mode, req.Owner, req.TTL)
			end(err)
			if errors.Is(err, ErrNotHeld) {
				continue // it expired already (this process was paused): ask again
			}
		}
		if err != nil {
			if !o.ownerSet && !errors.Is(err, ErrNotAcquired) && !errors.Is(err, ErrInvalid) {
				// The grant may have happened with its reply lost; the
				// owner is ours alone, so an owner-checked release is safe.
				l.cleanup(func(ctx context.Context) { _ = sh.ReleaseShared(ctx, key, req.Mode, req.Owner) })
			}
			if errors.Is(context.Cause(ctx), ErrClosed) {
				return nil, ErrClosed
			}
			return nil, err
		}
		lk, err := l.adoptAt(key, o, token, start, time.Now())
		if errors.Is(err, ErrClosed) {
			// adoptAt's own clean-up releases a mutex; release the hold.
			l.cleanup(func(ctx context.Context) { _ = sh.ReleaseShared(ctx, key, req.Mode, req.Owner) })
		}
		return lk, err
	}
}

// inspectShared lists the holders of the lock mode names on key.
func (l *Locker) inspectShared(ctx context.Context, key string, mode driver.SharedMode, n int) ([]Info, error) {
	op := "inspect " + mode.String()
	if mode.RW() {
		op = "inspect rwmutex"
	}
	sh, err := l.sharedLocker()
	if err == nil && mode == driver.SharedPermit {
		err = checkLimit(n)
	}
	if err == nil {
		err = l.checkKey(key)
	}
	if err != nil {
		return nil, wrap(ctx, op, key, err)
	}
	cctx, done, err := l.begin(ctx, l.life)
	if err != nil {
		return nil, wrap(ctx, op, key, err)
	}
	hs, err := sh.InspectShared(cctx, key, mode)
	if err = done(err); err != nil {
		return nil, wrap(ctx, op, key, err)
	}
	out := make([]Info, len(hs))
	for i, h := range hs {
		out[i] = Info{Owner: h.Owner, Token: h.Token, Remaining: h.Remaining, Kind: h.Mode.String()}
	}
	return out, nil
}
