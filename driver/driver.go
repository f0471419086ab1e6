// Package driver defines the interfaces a lock backend implements to be used
// through package locker, in the way database/sql/driver serves database/sql.
//
// A backend implements Driver and Locker, the small required set, and
// registers itself with locker.Register in an init function. Everything users
// see — waiting, renewal, loss detection, option validation, error wrapping —
// is built once in package locker on top of these primitives.
//
// Optional behaviour is discovered by type assertion on the Locker, as
// database/sql does: Waiter and BlockingAcquirer make waits event-driven,
// HoldWatcher reports a lock the server ended early, ChangeWatcher reports
// that a key's holder may have changed, Inspector reports the current
// holder, Capable describes TTL limits, the deadline margin and token
// durability, Pinger checks connectivity, BatchRefresher refreshes many
// locks in one request, and SharedLocker offers semaphores and read-write
// locks (shared holds, each with its own lease and token).
//
// Errors: a Locker returns ErrNotAcquired, ErrNotHeld, ErrClosed, ErrInvalid
// and ErrUnavailable (possibly wrapped) for the conditions they name; every
// other error is treated as transient by package locker. Errors should not carry
// a "locker:" prefix — package locker adds it, once — but should name the
// backend ("redis: …") where they come from one.
//
// This package depends on the standard library only.
package driver

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Driver opens lockers for one backend.
type Driver interface {
	// Open returns a Locker for the data source name dsn. The dsn is the
	// driver's own format; every driver in this module takes a URL whose
	// scheme is the name the driver is registered under, and rejects unknown
	// query parameters with an error wrapping ErrInvalid.
	Open(dsn string) (Locker, error)
}

// Locker is implemented by a backend. It is safe for concurrent use by
// multiple goroutines. Each method makes one attempt: waiting, retrying and
// renewal belong to package locker.
//
// The owner strings passed in are chosen by package locker (random 128-bit
// values unless the user sets one); the backend stores them with the lock and
// compares them on Refresh and Release. The owner, not the Locker, holds a
// lock: the same owner string through another Locker on the same backend is
// the holder (package locker's WithOwner hands a lock over between
// processes that way), and an owner string that differs in any byte is not.
// The one exception is a backend whose locks belong to the connection that
// took them (PostgreSQL advisory locks): it declares
// Capabilities.LockerBound, and then the same owner through another Locker
// is refused (ErrNotAcquired, ErrNotHeld) and changes nothing.
//
// A key is any non-empty string, and distinct keys never interfere. Every
// method that takes a key returns an error wrapping ErrInvalid for an empty
// one, and every method that takes a ttl for a non-positive one; such a call
// changes nothing. A driver may also reject keys longer than a limit it
// documents.
//
// Every method returns promptly once ctx is done, with an error wrapping
// ctx.Err(); a call whose ctx is already done changes nothing.
type Locker interface {
	// Acquire makes one atomic attempt to take key for owner for ttl. It
	// returns a fencing token, or ErrNotAcquired if another owner holds key
	// (a *HeldError, which wraps ErrNotAcquired, is preferred: it tells the
	// caller when to try again). Acquire by the current owner is idempotent:
	// it succeeds, resets the ttl and returns the same token, so a retry
	// after a lost reply is safe.
	//
	// The lock then lives for ttl, counted from the call: the server frees
	// it no earlier than ttl, less Capabilities.Margin(ttl), after the call
	// was sent, and soon after ttl has passed (the conformance suite allows
	// ttl/4 + 750ms, for servers that expire on a timer). A ttl the backend
	// cannot keep exactly is rounded up as Capabilities.RoundTTL says, never
	// down.
	//
	// The token is strictly greater than the token of every earlier grant of
	// key: across release, expiry and re-acquire. An Acquire by the former
	// owner of an expired lock is such a new grant, not the old one revived.
	Acquire(ctx context.Context, key, owner string, ttl time.Duration) (token uint64, err error)

	// Refresh resets the ttl of a lock owner holds, or returns ErrNotHeld and
	// changes nothing. The new ttl counts from the call and replaces the one
	// in force, whether it is longer or shorter. An expired lock is not
	// revived.
	Refresh(ctx context.Context, key, owner string, ttl time.Duration) error

	// Release frees a lock owner holds, or returns ErrNotHeld and changes
	// nothing.
	Release(ctx context.Context, key, owner string) error

	// Close releases the Locker's resources. It is idempotent; calls after
	// Close, of every method of every interface the Locker implements,
	// return ErrClosed. Locks still held on the server are left to expire:
	// nothing renews them after Close, so they end by their TTL at the
	// latest (a driver whose locks live in a session, such as PostgreSQL's
	// advisory locks, may end them at once). Package locker releases its
	// own locks before calling Close.
	Close() error
}

// Sentinel errors. Package locker exports the same values, so errors.Is
// matches them across the two layers.
var (
	// ErrNotAcquired means the lock is held by another owner.
	ErrNotAcquired = errors.New("lock is held by another owner")
	// ErrNotHeld means the caller does not hold the lock (any more).
	ErrNotHeld = errors.New("lock is not held")
	// ErrClosed means the Locker has been closed.
	ErrClosed = errors.New("locker is closed")
	// ErrInvalid means an argument or a data source name was rejected
	// before any I/O: an empty or oversized key, a non-positive TTL, a
	// malformed URL, an unknown query parameter.
	ErrInvalid = errors.New("invalid argument")
	// ErrUnavailable means the backend could not be reached at all: the
	// connection was refused or timed out, TLS or authentication failed
	// while connecting, or too few Redlock masters answered to make a
	// quorum. It says nothing about who holds a key: "someone else holds
	// it" is ErrNotAcquired. Package locker treats it as transient while an
	// Acquire waits.
	ErrUnavailable = errors.New("backend unavailable")
)

// HeldError is returned by Acquire when another owner holds the key and the
// backend learned, in the same round trip, how long that owner's lock has
// left. It wraps ErrNotAcquired.
type HeldError struct {
	// Remaining is the holder's remaining TTL as the server saw it: it
	// counts down from the TTL the holder last set. Zero or negative if
	// unknown.
	Remaining time.Duration
}

// Error implements error.
func (e *HeldError) Error() string {
	if e.Remaining > 0 {
		return fmt.Sprintf("%s (expires in %v)", ErrNotAcquired, e.Remaining)
	}
	return ErrNotAcquired.Error()
}

// Unwrap returns ErrNotAcquired.
func (e *HeldError) Unwrap() error { return ErrNotAcquired }

// Waiter is implemented by a Locker that can tell when a key may have become
// free (Redis pub/sub or client-side-caching invalidation, an etcd watch, a
// condition variable in memory), so that waiting needs no polling.
type Waiter interface {
	// Subscribe starts watching key. From the moment Subscribe returns,
	// wake receives a value (it is buffered; sends never block) each time
	// key may have become free: released or deleted, and expired unless
	// the driver's Acquire reports the holder's remaining TTL in a
	// *HeldError (package locker then wakes itself at that moment, so such
	// a driver need not watch for expiry). A driver
	// that queues subscribers on the server (etcd) may instead wake only the
	// subscriber whose turn it is, so a release wakes one process rather
	// than all. Spurious wake-ups are allowed; missed ones are not, except
	// across a lost connection, after which the driver sends one wake-up
	// (package locker also retries on a timer, capped at 2s, as a safety
	// net). cancel ends the subscription and may be called more than once.
	// Subscribe returns promptly with ctx.Err() once ctx is done.
	Subscribe(ctx context.Context, key string) (wake <-chan struct{}, cancel func(), err error)
}

// HoldWatcher is implemented by a Locker that can learn, without being
// asked, that the server ended a lock it granted before its TTL ran out: the
// key was deleted, evicted or overwritten by another owner, or the session
// that held it ended (a terminated or crashed backend, a reset connection).
// Package locker watches every lock it holds through it, so that Lost closes
// within a small bound of the server-side loss instead of at the next
// renewal.
type HoldWatcher interface {
	// WatchHold starts watching the grant of key to owner with token, in
	// the background: it must not wait for a round trip. lost is called at
	// most once, from any goroutine, with an error wrapping ErrNotHeld, and
	// only once the driver knows the server no longer holds key for owner:
	// a false alarm while the lock is held breaks the contract. Changes
	// made by owner itself (Refresh, Release, an idempotent Acquire) are not
	// a loss. A watch that breaks (a dropped connection) is re-established
	// and the lock re-checked, not reported as lost unless the check says
	// so. stop ends the watch; it may be called more than once and from
	// any goroutine, and must not wait for lost to return (lost may still
	// be called once after stop; package locker ignores it then). A
	// non-nil error means the grant is not watched; package locker then
	// relies on renewal alone.
	WatchHold(key, owner string, token uint64, lost func(error)) (stop func(), err error)
}

// ChangeWatcher is implemented by a Locker that can tell, without being
// asked, when the holder of a key may have changed: an etcd watch, Redis
// client-side-caching invalidations, PostgreSQL LISTEN. Package locker's
// Election.Observe uses it, so that an observer sees a new leader within a
// round trip of the grant instead of at its next read. A Waiter is not
// enough for that: it reports only that a key may have become free, never
// a grant, and may wake only the waiter whose turn it is.
type ChangeWatcher interface {
	// WatchChanges starts watching key. From the moment it returns,
	// changed is called each time the holder of key may have changed: a
	// grant to an owner that did not hold key (a takeover of an expired
	// lock included), a release, a deletion. An expiry with no other
	// change need not be reported (package locker reads the holder again
	// when its remaining TTL runs out); a refresh or an idempotent Acquire
	// need not be either. Spurious calls are allowed; missed ones are not,
	// except across a lost connection, after which the driver calls
	// changed once it is re-established. changed is called from any
	// goroutine, never concurrently with itself; it must return at once
	// and must not call the Locker. stop ends the watch, may be called
	// more than once, and must not wait for changed to return (changed
	// may still be called once after stop). A non-nil error means key is
	// not watched (for example errors.ErrUnsupported where the deployment
	// cannot notify); package locker then relies on reads.
	WatchChanges(ctx context.Context, key string, changed func()) (stop func(), err error)
}

// BlockingAcquirer is implemented by a Locker whose server can queue the
// waiters itself (PostgreSQL's lock manager, an etcd queue of waiters).
type BlockingAcquirer interface {
	// AcquireWait is Acquire that waits: it blocks on the server until key
	// is granted to owner or ctx is done, in which case it returns an error
	// wrapping ctx.Err() and leaves nothing held or queued.
	AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (token uint64, err error)
}

// Info describes the current holder of a key.
type Info struct {
	// Owner is the holder's owner string.
	Owner string
	// Token is the fencing token of the current grant.
	Token uint64
	// Remaining is the TTL the lock has left, as the server sees it: it
	// counts down from the TTL the holder last set.
	Remaining time.Duration
}

// Inspector is implemented by a Locker that can report who holds a key.
type Inspector interface {
	// Inspect returns the current holder of key, or ErrNotHeld if the key is
	// free. It does not change anything.
	Inspect(ctx context.Context, key string) (Info, error)
}

// Capabilities describes a backend's limits. The zero value means: any
// positive TTL is honoured exactly, and tokens do not survive a restart of
// the server.
type Capabilities struct {
	// MinTTL is the shortest TTL the backend honours. Package locker rounds
	// shorter TTLs up to it; a driver handed a shorter one rounds it up the
	// same way or rejects it with ErrInvalid.
	MinTTL time.Duration
	// TTLGranularity is the unit TTLs are rounded up to (etcd: a second).
	// Zero means the backend keeps any duration.
	TTLGranularity time.Duration
	// DurableTokens reports that fencing tokens keep increasing across a
	// restart of the server that loses all its data.
	DurableTokens bool
	// DriftFactor and DriftFixed widen the margin the holder keeps between
	// its safe deadline and the server's expiry: ttl×DriftFactor +
	// DriftFixed (Redlock: its drift_factor and 2ms). Package locker uses
	// Margin, never less than its own default; zero values leave the
	// default in force. Whatever it declares, a driver's server never frees
	// a lock earlier than ttl − Margin(ttl) after the call that set its ttl
	// was sent.
	DriftFactor float64
	DriftFixed  time.Duration
	// LockerBound reports that a lock belongs to the Locker (the
	// connection, the session) that took it, not to its owner string: the
	// same owner through another Locker cannot refresh, release or
	// re-acquire it (PostgreSQL advisory locks). Package locker's WithOwner
	// hand-over does not work on such a backend.
	LockerBound bool
	// MaxOwner is the longest owner, in bytes, that the backend keeps and
	// Inspect reports back exactly as it was given. Zero means no limit
	// (package locker's own owners are at most 256 bytes). A driver may
	// accept longer owners, compared exactly, that Inspect shows in another
	// form (PostgreSQL advisory mode: a hash), or refuse them with
	// ErrInvalid. Package locker refuses, with ErrInvalid and before any
	// I/O, an election value whose owner would exceed it.
	MaxOwner int
	// OwnerASCII reports that Inspect reports an owner back exactly only
	// if every byte of it is printable ASCII (0x20 to 0x7e), as MaxOwner
	// for the length. False means any bytes.
	OwnerASCII bool
}

// Default deadline margin: a 1% clock-rate difference plus 2ms of rounding.
const (
	DefaultDriftFactor = 0.01
	DefaultDriftFixed  = 2 * time.Millisecond
)

// Margin returns how much earlier than ttl the holder's safe deadline falls:
// the larger of the default (ttl/100 + 2ms) and the driver's declared
// ttl×DriftFactor + DriftFixed. The holder's Lost closes at the start of the
// last successful acquire or refresh plus ttl minus Margin(ttl).
func (c Capabilities) Margin(ttl time.Duration) time.Duration {
	def := time.Duration(float64(ttl)*DefaultDriftFactor) + DefaultDriftFixed
	own := time.Duration(float64(ttl)*c.DriftFactor) + c.DriftFixed
	return max(def, own)
}

// Capable is implemented by a Locker that reports its Capabilities.
type Capable interface {
	Capabilities() Capabilities
}

// Pinger is implemented by a Locker that can check it reaches its server.
type Pinger interface {
	// Ping makes one round trip to the server; it returns nil when the
	// server answered.
	Ping(ctx context.Context) error
}

// RoundTTL applies c to ttl: it raises ttl to MinTTL and rounds it up to a
// multiple of TTLGranularity. Drivers and package locker use it so that both
// layers agree on the effective TTL.
func (c Capabilities) RoundTTL(ttl time.Duration) time.Duration {
	if ttl < c.MinTTL {
		ttl = c.MinTTL
	}
	if g := c.TTLGranularity; g > 0 && ttl%g != 0 {
		ttl += g - ttl%g
	}
	return ttl
}
