package rueidis

import (
	"context"
	"time"

	"github.com/go-locker/locker/driver"
)

// AcquireShared implements driver.SharedLocker, as drivers/redis does (see
// the package documentation, Shared holds): a permit, a read or a write
// hold of key as req asks, one round trip unless it waits in the lock's
// fair queue. A one-shot request that does not fit gets a
// *driver.HeldError or driver.ErrNotAcquired; an owner that holds the
// read-write lock in the other mode, driver.ErrInvalid at once; bad
// arguments, ctx and Close as for Acquire. Redlock refuses it before any
// I/O (SharedUnsupported).
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	return l.core.AcquireShared(ctx, key, req)
}

// RefreshShared implements driver.SharedLocker in one round trip:
// driver.ErrNotHeld unless owner holds key in mode, a lease never revived.
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	return l.core.RefreshShared(ctx, key, mode, owner, ttl)
}

// ReleaseShared implements driver.SharedLocker in one round trip, granting
// the queued requests that now fit: driver.ErrNotHeld unless owner holds
// key in mode.
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	return l.core.ReleaseShared(ctx, key, mode, owner)
}

// InspectShared implements driver.SharedLocker in one round trip: the
// holders of key's semaphore (driver.SharedPermit) or read-write lock,
// token order.
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	return l.core.InspectShared(ctx, key, mode)
}

// SharedUnsupported implements driver.SharedRefuser without I/O: an error
// matching errors.ErrUnsupported, with the reason, under Redlock; nil
// otherwise.
func (l *Locker) SharedUnsupported() error { return l.core.SharedUnsupported() }
