package rueidis

import (
	"context"
	"time"

	"github.com/go-locker/locker/driver"
)

// Acquire implements driver.Locker: one atomic attempt to take key for
// owner for ttl, returning the fencing token. It is one round trip (a
// script doing SET NX PX and minting the token) on a single node, Cluster
// or Sentinel master; Redlock runs it on every master in parallel. An
// acquire by the owner that holds key resets the ttl and returns the same
// token. When another owner holds key it returns a *driver.HeldError
// (matching driver.ErrNotAcquired) with the holder's remaining TTL. An
// empty or oversized key (Options.MaxKeyLen, URL max_key_len), an empty
// owner or a non-positive ttl wrap driver.ErrInvalid; after Close,
// driver.ErrClosed; a done ctx, ctx.Err() wrapped.
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.core.Acquire(ctx, key, owner, ttl)
}

// AcquireWait implements driver.BlockingAcquirer: it waits until key is
// granted to owner and returns the fencing token. On a single server,
// Cluster or Sentinel master the waiters queue on the server and are
// granted in arrival order, a release waking only the next (see the
// package documentation, Fairness); with Options.Barging (URL fair=false)
// and under Redlock every waiter is woken and the first to retry wins. A
// free key costs one round trip, as Acquire. ctx bounds the wait; its end
// returns an error wrapping ctx.Err() and leaves nothing held or queued.
// Errors as for Acquire, but never a *driver.HeldError.
func (l *Locker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.core.AcquireWait(ctx, key, owner, ttl)
}

// Refresh implements driver.Locker: one round trip (compare owner, then
// PEXPIRE; Redlock: on a quorum of masters) resets the ttl of the lock
// owner holds on key. It returns driver.ErrNotHeld if owner does not hold
// key; an expired lock is never revived. Bad arguments, Close and ctx: as
// for Acquire.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return l.core.Refresh(ctx, key, owner, ttl)
}

// RefreshBatch implements driver.BatchRefresher: every item's Refresh in
// one round trip, a pipeline (on a Cluster, one per node, in parallel;
// under Redlock, one per master in parallel, each item decided on its
// quorum as Refresh decides). One error per item, as Refresh's for it.
func (l *Locker) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	return l.core.RefreshBatch(ctx, items)
}

// Release implements driver.Locker: one round trip (compare owner, DEL,
// PUBLISH) frees the lock owner holds on key. The DEL invalidates the key
// in every client tracking it, which wakes their waiters. It returns
// driver.ErrNotHeld, changing nothing, if owner does not hold key. Bad
// arguments, Close and ctx: as for Acquire.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	return l.core.Release(ctx, key, owner)
}

// Inspect implements driver.Inspector: the holder, token and remaining TTL
// of key's lock, in one round trip; driver.ErrNotHeld if key is free.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return l.core.Inspect(ctx, key)
}

// Capabilities implements driver.Capable: MinTTL 10ms (Redlock: 3 ×
// Options.NodeTimeout), millisecond granularity, and tokens that survive a
// server restart (see the package documentation for the clock
// assumption).
func (l *Locker) Capabilities() driver.Capabilities { return l.core.Capabilities() }

// Ping implements driver.Pinger: one round trip to every server (Redlock:
// a quorum of masters must answer, each within Options.NodeTimeout).
func (l *Locker) Ping(ctx context.Context) error { return l.core.Ping(ctx) }

// Subscribe implements driver.Waiter: every local subscriber of one key
// shares one server-side watch, a client-side-caching read of the lock key
// (Lockers from Open and NewWithClientOption) or a SUBSCRIBE to its
// channel (clients adopted with New or NewRedlock). From its return, wake
// receives a value when the key is released, expires or is overwritten,
// and once after a lost connection; cancel ends the wait. Errors:
// driver.ErrInvalid for a bad key, driver.ErrClosed after Close, ctx.Err()
// wrapped when ctx is done, or the server's error.
func (l *Locker) Subscribe(ctx context.Context, key string) (wake <-chan struct{}, cancel func(), err error) {
	return l.core.Subscribe(ctx, key)
}

// WatchHold implements driver.HoldWatcher, over client-side-caching
// invalidations (see the package documentation, "Watching a held lock"):
// lost is called when key is deleted, evicted, expires or is overwritten
// by another grant, never for this Locker's own refreshes and release.
// stop ends the watch. It is supported on Lockers from Open (single
// server, Cluster, Sentinel) and NewWithClientOption; Redlock and adopted
// clients (New, NewRedlock) return an error, and their locks are watched
// by renewal alone. Errors: driver.ErrClosed after Close.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (stop func(), err error) {
	return l.core.WatchHold(key, owner, token, lost)
}

// Close ends every wait and hold watch and closes the clients the Locker
// owns (those Open and NewWithClientOption built, not those given to New
// or NewRedlock). Locks still held are left to expire. It is idempotent;
// later calls of every other method return driver.ErrClosed.
func (l *Locker) Close() error { return l.core.Close() }

// WatchChanges implements driver.ChangeWatcher, over the same
// client-side-caching invalidations as WatchHold: key's lock is read on
// the watch client, and read again after each invalidation; changed is
// called when a read finds another value than the last (a grant, a
// release, an expiry, an eviction; a refresh keeps the value), when a
// read finds the key absent again after an invalidation (a grant and its
// release between two reads), and after the first read. It returns at once; the first read runs in the
// background. It is supported where WatchHold is; other Lockers return an
// error matching errors.ErrUnsupported. Errors: driver.ErrInvalid for a
// bad key, driver.ErrClosed after Close, ctx.Err() (wrapped) if ctx is
// done.
func (l *Locker) WatchChanges(ctx context.Context, key string, changed func()) (stop func(), err error) {
	return l.core.WatchChanges(ctx, key, changed)
}
