package locker

import (
	"context"

	"github.com/go-locker/locker/driver"
)

// RWMutex is a read-write lock on a key: any number of readers, or one
// writer. Every hold has its own lease, owner, fencing token and loss
// signal. Make one with Locker.RWMutex; it is a small value that makes no
// call until used, and is safe for concurrent use.
//
// Writers are preferred: once a writer waits, readers that arrive after it
// wait behind it, so a stream of readers never starves a writer; it is
// granted once the holds in force when it arrived have been released or
// have expired. Tokens come from one counter per key, so a writer's token
// exceeds every earlier reader's and writer's, and a resource that keeps
// the highest token it has seen rejects a stale writer.
//
// There are no upgrades: AcquireWrite by an owner that holds the read lock
// (the same WithOwner) fails at once with ErrInvalid rather than deadlock,
// and so does AcquireRead by the writer. Release the read lock, then
// acquire the write lock, and re-read what the write depends on.
//
// The read-write lock is a lock of its own: the mutex and the semaphore on
// the same key string are different locks. It needs a driver that
// implements driver.SharedLocker; on any other every call fails before any
// I/O with an error matching errors.ErrUnsupported that names the driver.
type RWMutex struct {
	l   *Locker
	key string
}

// RWMutex returns the read-write lock on key.
func (l *Locker) RWMutex(key string) *RWMutex {
	return &RWMutex{l: l, key: key}
}

// Key returns the lock's key.
func (rw *RWMutex) Key() string { return rw.key }

// AcquireRead takes a read hold, shared with other readers, waiting as long
// as ctx allows while a writer holds the lock or waits for it. It behaves
// as Semaphore.Acquire otherwise: the returned Lock is a mutex's, ctx bounds
// the wait only, and the errors are the same, plus ErrInvalid for an owner
// that holds the write lock.
func (rw *RWMutex) AcquireRead(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.l.acquireShared(ctx, rw.key, driver.SharedRead, 0, opts, true)
}

// AcquireWrite takes the write hold, exclusive of every other, waiting as
// long as ctx allows. From the moment it waits, later readers queue behind
// it. Its errors are those of AcquireRead, with ErrInvalid for an owner
// that holds the read lock (no upgrades).
func (rw *RWMutex) AcquireWrite(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.l.acquireShared(ctx, rw.key, driver.SharedWrite, 0, opts, true)
}

// TryAcquireRead makes one attempt to take a read hold. It returns
// ErrNotAcquired while a writer holds the lock or waits for it.
func (rw *RWMutex) TryAcquireRead(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.l.acquireShared(ctx, rw.key, driver.SharedRead, 0, opts, false)
}

// TryAcquireWrite makes one attempt to take the write hold. It returns
// ErrNotAcquired while anyone holds the lock or waits for it.
func (rw *RWMutex) TryAcquireWrite(ctx context.Context, opts ...Option) (*Lock, error) {
	return rw.l.acquireShared(ctx, rw.key, driver.SharedWrite, 0, opts, false)
}

// DoRead takes a read hold (waiting as AcquireRead does), runs fn, and
// releases the hold when fn returns or panics, as Locker.Do does.
func (rw *RWMutex) DoRead(ctx context.Context, fn func(context.Context) error, opts ...Option) error {
	lk, err := rw.AcquireRead(ctx, opts...)
	if err != nil {
		return err
	}
	return doHeld(ctx, lk, fn)
}

// DoWrite takes the write hold (waiting as AcquireWrite does), runs fn, and
// releases the hold when fn returns or panics, as Locker.Do does.
func (rw *RWMutex) DoWrite(ctx context.Context, fn func(context.Context) error, opts ...Option) error {
	lk, err := rw.AcquireWrite(ctx, opts...)
	if err != nil {
		return err
	}
	return doHeld(ctx, lk, fn)
}

// Inspect lists the holders now, in token order: the readers (Kind "read")
// or the writer (Kind "write"), each with its owner, token and remaining
// TTL. An empty list means the lock is free. It changes nothing.
func (rw *RWMutex) Inspect(ctx context.Context) ([]Info, error) {
	return rw.l.inspectShared(ctx, rw.key, driver.SharedRead, 0)
}
