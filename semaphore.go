package locker

import (
	"context"

	"github.com/go-locker/locker/driver"
)

// Semaphore is a counting lock on a key: at most n holders at once, each
// with its own lease, owner, fencing token and loss signal. Make one with
// Locker.Semaphore; it is a small value that makes no call until used, and
// is safe for concurrent use.
//
// A semaphore is a lock of its own: the mutex (Locker.Acquire) and the
// read-write lock (Locker.RWMutex) on the same key string are different
// locks and never block it.
//
// The limit is per call: a permit is granted only while fewer than the
// caller's n hold the key. Callers that pass different n for one key
// therefore never admit more holders than the largest n, and a caller with
// a smaller n waits until the holders fall below its own n.
//
// It needs a driver that implements driver.SharedLocker; on any other every
// call fails before any I/O with an error matching errors.ErrUnsupported
// that names the driver.
type Semaphore struct {
	l   *Locker
	key string
	n   int
}

// Semaphore returns the semaphore on key with limit n. n must be 1 to
// MaxSemaphoreLimit; otherwise every call on it fails with ErrInvalid before
// any I/O.
func (l *Locker) Semaphore(key string, n int) *Semaphore {
	return &Semaphore{l: l, key: key, n: n}
}

// Key returns the semaphore's key.
func (s *Semaphore) Key() string { return s.key }

// Limit returns n, the most holders this Semaphore admits.
func (s *Semaphore) Limit() int { return s.n }

// Acquire takes a permit, waiting as long as ctx allows while n others
// hold one. The wait is queued in the backend and woken by releases and
// expiries, without polling; waiters are served in arrival order where the
// backend queues. ctx bounds the wait only, never the life of the returned
// Lock, which behaves as a mutex's: TTL and renewal, Lost and Err, Refresh,
// Release, and every Option. Acquire by an owner that already holds a
// permit (WithOwner) succeeds at once with the same token.
//
// Errors: ErrInvalid for an empty key, an n out of range or a bad option
// (before any I/O); an error matching errors.ErrUnsupported if the driver
// has no shared holds; ErrClosed; ctx.Err() wrapped when ctx ends first; or
// the driver's error. A failed or cancelled Acquire leaves nothing held.
func (s *Semaphore) Acquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.l.acquireShared(ctx, s.key, driver.SharedPermit, s.n, opts, true)
}

// TryAcquire makes one attempt to take a permit. It returns ErrNotAcquired
// when n owners hold one, or when others wait for a permit already. Its
// other errors are those of Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...Option) (*Lock, error) {
	return s.l.acquireShared(ctx, s.key, driver.SharedPermit, s.n, opts, false)
}

// Do takes a permit (waiting as Acquire does), runs fn, and releases the
// permit when fn returns or panics, as Locker.Do does for a mutex: fn's
// context is cancelled the moment the permit is lost, with the Lock's Err
// as its cause.
func (s *Semaphore) Do(ctx context.Context, fn func(context.Context) error, opts ...Option) error {
	lk, err := s.Acquire(ctx, opts...)
	if err != nil {
		return err
	}
	return doHeld(ctx, lk, fn)
}

// Inspect lists the holders of a permit now, in token order, each with its
// owner, token and remaining TTL (Kind "semaphore"). An empty list means no
// permit is held. It changes nothing. Errors are those of Acquire, less
// ErrNotAcquired.
func (s *Semaphore) Inspect(ctx context.Context) ([]Info, error) {
	return s.l.inspectShared(ctx, s.key, driver.SharedPermit, s.n)
}
