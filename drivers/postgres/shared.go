package postgres

import (
	"context"
	"crypto/sha512"
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	"github.com/go-locker/locker/driver"
)

// AcquireShared implements driver.SharedLocker: semaphores (SharedPermit)
// and read-write locks (SharedRead, SharedWrite). See the package
// documentation for each mode's design.
//
// In advisory mode each hold is a session-level advisory lock on a pooled
// connection pinned to it, as a mutex's is, with the hold's TTL armed as
// idle_session_timeout: a read hold is pg_advisory_lock_shared and a write
// hold pg_advisory_lock on the read-write lock's key (the server's lock
// manager queues them, and a waiting writer makes later readers wait); a
// permit is one of the semaphore's slot keys, taken under the semaphore's
// guard only while fewer than req.Limit slots are held. A waiting read or
// write blocks in the lock manager; a waiting permit retries at once when
// a permit of the key is released through this Locker, and otherwise
// after 5ms, doubling to 50ms. Holds belong to the Locker that took them
// (Capabilities.LockerBound).
//
// In lease mode each lock is one row of the table <schema>.locker_shared,
// changed by one statement per operation under the row's lock; waits are
// woken by LISTEN/NOTIFY, as the mutex's.
//
// Errors wrap driver.ErrInvalid (empty key or owner, an invalid mode, a
// permit limit outside 1..driver.MaxSharedLimit, ttl ≤ 0 or > MaxTTL, or a
// request for the other side of a read-write lock its owner holds),
// driver.ErrNotAcquired (a *driver.HeldError), driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err().
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if _, err := checkShared(key, req.Mode, req.Owner, req.TTL); err != nil {
		return 0, err
	}
	if err := driver.CheckLimit(req); err != nil {
		return 0, fmt.Errorf("postgres: %w", err)
	}
	if l.lease != nil {
		return l.lease.acquireShared(ctx, key, req)
	}
	return l.adv.acquireShared(ctx, key, req)
}

// RefreshShared implements driver.SharedLocker: it resets the TTL of the
// hold owner has of key in mode (in advisory mode, through this Locker).
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err().
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if _, err := checkShared(key, mode, owner, ttl); err != nil {
		return err
	}
	if l.lease != nil {
		return l.lease.refreshShared(ctx, key, mode, owner, ttl)
	}
	return l.adv.refreshShared(ctx, key, mode, owner, ttl)
}

// ReleaseShared implements driver.SharedLocker: it ends the hold owner has
// of key in mode (in advisory mode, through this Locker).
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err().
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if _, err := checkShared(key, mode, owner, time.Millisecond); err != nil {
		return err
	}
	if l.lease != nil {
		return l.lease.releaseShared(ctx, key, mode, owner)
	}
	return l.adv.releaseShared(ctx, key, mode, owner)
}

// InspectShared implements driver.SharedLocker: the live holders of the
// lock mode names on key, in token order. In advisory mode they are read
// from pg_locks and pg_stat_activity: an owner is reported as its tag in
// application_name (see Inspect) unless this Locker holds the hold.
//
// Errors wrap driver.ErrInvalid, driver.ErrUnavailable, driver.ErrClosed
// or ctx.Err().
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if _, err := checkShared(key, mode, "-", time.Millisecond); err != nil {
		return nil, err
	}
	var hs []driver.SharedInfo
	var err error
	if l.lease != nil {
		hs, err = l.lease.inspectShared(ctx, key, mode)
	} else {
		hs, err = l.adv.inspectShared(ctx, key, mode)
	}
	slices.SortFunc(hs, func(a, b driver.SharedInfo) int { return compareUint(a.Token, b.Token) })
	return hs, err
}

func compareUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// checkShared validates the arguments every shared call has and returns
// the TTL in ms.
func checkShared(key string, mode driver.SharedMode, owner string, ttl time.Duration) (int64, error) {
	if err := driver.CheckMode(mode); err != nil {
		return 0, fmt.Errorf("postgres: %w", err)
	}
	return checkCall(key, owner, ttl)
}

// sharedKind is the namespace of mode's lock: 's' for a semaphore, 'r' for
// a read-write lock.
func sharedKind(mode driver.SharedMode) byte {
	if mode == driver.SharedPermit {
		return 's'
	}
	return 'r'
}

// sharedHash is the 64-bit hash of a shared lock of kind on key in ns: the
// first 8 bytes of SHA-512/256(kind || ns || 0x00 || key). It is another
// hash function than the mutex's SHA-256 (AdvisoryKey), so a mutex, a
// semaphore and a read-write lock on one key string hash independently; the
// kind byte separates the two shared kinds.
func sharedHash(ns string, kind byte, key string) uint64 {
	return binary.BigEndian.Uint64(sharedSum(ns, kind, key))
}

// sharedSum is SHA-512/256(kind || ns || 0x00 || key).
func sharedSum(ns string, kind byte, key string) []byte {
	h := sha512.New512_256()
	h.Write([]byte{kind})
	h.Write([]byte(ns))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return h.Sum(nil)
}
