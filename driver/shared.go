package driver

import (
	"context"
	"fmt"
	"time"
)

// SharedMode is the kind of a shared hold: a permit of a semaphore, or the
// read or write side of a read-write lock.
//
// The mode also names the lock a hold belongs to. A mutex (Locker), a
// semaphore (SharedPermit) and a read-write lock (SharedRead, SharedWrite)
// on the same key string are three different locks that never interfere: a
// driver keeps them in separate namespaces. SharedRead and SharedWrite on
// one key are the two sides of one read-write lock.
type SharedMode uint8

// The modes of a shared hold.
const (
	// SharedPermit is one of at most n holds of a semaphore, where n is
	// the caller's SharedRequest.Limit.
	SharedPermit SharedMode = 1 + iota
	// SharedRead is a read hold of a read-write lock: shared with other
	// readers, excluded by a writer.
	SharedRead
	// SharedWrite is the write hold of a read-write lock: it excludes every
	// other hold of the lock, read or write.
	SharedWrite
)

// String returns "semaphore", "read" or "write", the values of the
// OpenTelemetry attribute locker.kind for these holds, or "invalid".
func (m SharedMode) String() string {
	switch m {
	case SharedPermit:
		return "semaphore"
	case SharedRead:
		return "read"
	case SharedWrite:
		return "write"
	}
	return "invalid"
}

// Valid reports whether m is one of SharedPermit, SharedRead, SharedWrite.
func (m SharedMode) Valid() bool { return m >= SharedPermit && m <= SharedWrite }

// RW reports whether m is a side of a read-write lock (SharedRead or
// SharedWrite), as opposed to a semaphore permit.
func (m SharedMode) RW() bool { return m == SharedRead || m == SharedWrite }

// MaxSharedLimit is the largest semaphore limit n a SharedLocker must
// accept. A SharedRequest with SharedPermit and a Limit below 1 or above it
// is rejected with ErrInvalid before any I/O, by package locker and by the
// driver. It keeps slot-based designs (n advisory locks, n slot files)
// bounded.
const MaxSharedLimit = 1024

// SharedRequest is one request for a shared hold.
type SharedRequest struct {
	// Mode is the kind of hold asked for.
	Mode SharedMode
	// Owner identifies the holder, as for Locker.Acquire.
	Owner string
	// TTL is the hold's lease: this holder's own, independent of the
	// others'. It must be positive.
	TTL time.Duration
	// Limit is the semaphore's n for SharedPermit: the grant is made only
	// while fewer than Limit owners hold the key. It is per request, so
	// callers that pass different limits never admit more holders than the
	// largest of them. It must be 1 to MaxSharedLimit for SharedPermit, and
	// is ignored for SharedRead and SharedWrite.
	Limit int
	// Wait makes the call wait until the hold can be granted or ctx is
	// done. A waiting request is queued: waiters are granted in arrival
	// order, where the backend queues, and a waiting SharedWrite blocks
	// SharedRead requests that arrive after it (writer preference). A
	// request that ends with ctx leaves nothing held and nothing queued.
	// Without Wait the call makes one attempt.
	Wait bool
}

// CheckMode returns an error wrapping ErrInvalid, without a driver's
// prefix, if m is not a valid SharedMode; nil otherwise.
func CheckMode(m SharedMode) error {
	if !m.Valid() {
		return fmt.Errorf("%w: unknown shared mode %d", ErrInvalid, m)
	}
	return nil
}

// CheckLimit returns an error wrapping ErrInvalid, without a driver's
// prefix, if r asks for a SharedPermit with a Limit outside
// 1..MaxSharedLimit; nil otherwise. It checks neither the mode nor the TTL.
func CheckLimit(r SharedRequest) error {
	if r.Mode == SharedPermit && (r.Limit < 1 || r.Limit > MaxSharedLimit) {
		return fmt.Errorf("%w: semaphore limit must be 1 to %d, got %d", ErrInvalid, MaxSharedLimit, r.Limit)
	}
	return nil
}

// SharedInfo describes one holder of a semaphore or read-write lock.
type SharedInfo struct {
	Info
	// Mode is the kind of the hold.
	Mode SharedMode
}

// SharedLocker is implemented by a Locker that offers shared holds:
// semaphores (at most n holders of a key) and read-write locks (many
// readers, or one writer). Package locker's Semaphore and RWMutex need it;
// on a driver without it they fail before any I/O with an error matching
// errors.ErrUnsupported.
//
// Every hold is a lease of its own: it has its own TTL, is refreshed and
// released by its owner only, and expires on its own, not before its TTL
// (less Capabilities.Margin) and soon after it, as a Locker's lock does;
// the other holders keep theirs. A key, owner, ttl or ctx is handled as by
// Locker: ErrInvalid for an empty key or a non-positive ttl, prompt return
// wrapping ctx.Err() once ctx is done, ErrClosed after Close. An invalid
// mode, or a SharedPermit Limit outside 1..MaxSharedLimit, is ErrInvalid.
//
// The obligations, each checked by the conformance suite:
//
//   - The limit: never more than Limit holders of a semaphore (each
//     request's own Limit at the time of its grant), and never a writer
//     together with any other holder of its read-write lock. The check and
//     the grant are one atomic step on the server.
//   - Tokens: every grant carries a token strictly greater than every
//     earlier grant's for that key (a permit, a read or a write): across
//     release, expiry and, where Capabilities.DurableTokens, restarts. A
//     writer's token therefore exceeds every earlier reader's and writer's.
//     Tokens may share a counter with the mutex on the same key.
//   - Idempotence: a request by an owner that holds the same lock in the
//     same mode succeeds, resets its ttl and returns the same token. There
//     are no upgrades or downgrades: a request by an owner that holds the
//     read-write lock in the other mode fails with ErrInvalid at once and
//     changes nothing (release the read hold, then ask for the write hold).
//   - Writer preference: once a SharedWrite request waits, SharedRead
//     requests that arrive after it are not granted before it (a one-shot
//     SharedRead gets ErrNotAcquired); the writer is granted once the holds
//     in force when it arrived have been released or have expired.
//   - Waiting without polling: a release or an expiry grants, or wakes, the
//     waiters that can now be granted, in order, and not the others.
type SharedLocker interface {
	// AcquireShared asks for a hold of key as req describes. It returns the
	// grant's fencing token, or ErrNotAcquired (a *HeldError where the
	// remaining TTL of the hold in the way is known) if req.Wait is false
	// and the hold cannot be granted now.
	AcquireShared(ctx context.Context, key string, req SharedRequest) (token uint64, err error)

	// RefreshShared resets the ttl of the hold of key that owner has in
	// mode, or returns ErrNotHeld and changes nothing (the hold expired,
	// was released, or owner holds key in another mode or not at all).
	RefreshShared(ctx context.Context, key string, mode SharedMode, owner string, ttl time.Duration) error

	// ReleaseShared ends the hold of key that owner has in mode, or returns
	// ErrNotHeld and changes nothing.
	ReleaseShared(ctx context.Context, key string, mode SharedMode, owner string) error

	// InspectShared lists the live holders of the lock mode names on key
	// (SharedPermit: the semaphore; SharedRead or SharedWrite: the
	// read-write lock, readers and writer alike), in token order. A free
	// lock is an empty list and no error. It changes nothing.
	InspectShared(ctx context.Context, key string, mode SharedMode) ([]SharedInfo, error)
}

// SharedRefuser is implemented by a driver whose type has the SharedLocker
// methods but whose configuration may refuse shared holds (the Redis
// drivers under Redlock). SharedUnsupported makes no I/O: it returns nil
// when shared holds work, or else the error every SharedLocker call returns
// before any I/O, one matching errors.ErrUnsupported that names the driver
// and the reason. Package locker and the conformance suite treat a driver
// whose SharedUnsupported returns an error as one without SharedLocker.
type SharedRefuser interface {
	SharedUnsupported() error
}
