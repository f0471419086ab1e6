package redis

import (
	"context"
	"time"

	"github.com/go-locker/locker/driver"
)

// AcquireShared implements driver.SharedLocker: a permit of the semaphore
// on key, or a read or write hold of its read-write lock, as req asks
// (see the package documentation, Shared holds). It is one round trip
// when the hold fits or req.Wait is false; a waiting request joins the
// lock's fair queue with its mode and is granted, in order, by a release
// or an expiry. Errors: a *driver.HeldError or driver.ErrNotAcquired for a
// one-shot request that does not fit; driver.ErrInvalid for bad
// arguments, and at once for an owner that holds the read-write lock in
// the other mode; ctx.Err() wrapped; driver.ErrClosed. Under Redlock every
// shared call fails before any I/O with an error matching
// errors.ErrUnsupported (see SharedUnsupported).
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	return l.core.AcquireShared(ctx, key, req)
}

// RefreshShared implements driver.SharedLocker: one round trip resets the
// ttl of owner's hold of key in mode; driver.ErrNotHeld if it ended (a
// lease is never revived) or owner holds key in another mode.
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	return l.core.RefreshShared(ctx, key, mode, owner, ttl)
}

// ReleaseShared implements driver.SharedLocker: one round trip ends
// owner's hold of key in mode and grants the waiters that now fit;
// driver.ErrNotHeld if owner has no such hold.
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	return l.core.ReleaseShared(ctx, key, mode, owner)
}

// InspectShared implements driver.SharedLocker: one round trip lists the
// live holders of the semaphore (driver.SharedPermit) or of the read-write
// lock (driver.SharedRead, driver.SharedWrite) on key, in token order.
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	return l.core.InspectShared(ctx, key, mode)
}

// SharedUnsupported implements driver.SharedRefuser, without I/O: nil on
// a single server, Cluster or Sentinel master; under Redlock an error
// matching errors.ErrUnsupported that gives the reason (independent
// majorities could admit different sets of n holders).
func (l *Locker) SharedUnsupported() error { return l.core.SharedUnsupported() }
