package locker

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-locker/locker/driver"
)

// Sentinel errors, matched with errors.Is. They are the values of package
// driver, so an error returned by a driver matches them too.
var (
	// ErrNotAcquired is returned by TryAcquire when another owner holds the
	// key.
	ErrNotAcquired = driver.ErrNotAcquired
	// ErrNotHeld is returned by Lock.Refresh and Lock.Release once the lock
	// is no longer held: released, expired, taken over or presumed lost.
	ErrNotHeld = driver.ErrNotHeld
	// ErrClosed is returned by every call on a Locker, and on its Locks,
	// after Close, and by a call that Close cut short (an Acquire that was
	// waiting, a call in flight; see Locker.Close).
	ErrClosed = driver.ErrClosed
	// ErrInvalid is returned, before any I/O, for an empty key, a zero or
	// negative TTL, a malformed URL or an unknown URL query parameter.
	ErrInvalid = driver.ErrInvalid
	// ErrUnavailable is matched by errors from a backend that could not be
	// reached at all (refused, unreachable, TLS or authentication failure
	// while connecting, no Redlock quorum), as opposed to ErrNotAcquired,
	// which means the backend answered that someone else holds the key.
	// The drivers wrap their reachability errors with it, and every layer
	// of this package keeps it matchable with errors.Is:
	//
	//   - Open and OpenURL return it when the driver checks the backend at
	//     open and cannot reach it.
	//   - TryAcquire, and the first attempt of Acquire and Do, fail fast
	//     with it: a caller is not left waiting on a backend that is down.
	//   - Once Acquire is waiting (its first attempt found the key held),
	//     it is transient: the wait goes on, retried with backoff, and if
	//     the context ends first the error returned wraps both ctx.Err()
	//     and the last such error.
	//   - Lock.Refresh, Lock.Release, Locker.Inspect and Locker.Ping return
	//     it as they get it. Background renewal treats it as transient,
	//     retrying until the safe deadline, when Lost closes with
	//     CauseDeadline.
	//
	// Tested by TestErrUnavailableThroughEveryLayer.
	ErrUnavailable = driver.ErrUnavailable
)

// LostCause says why a lock was lost. It is an error, so that
// errors.Is(lk.Err(), locker.CauseMaxHold) picks a cause out, and
// errors.As(lk.Err(), &cause) reads it. Its values are those of the
// attribute locker.cause on the metric locker.lost.
type LostCause string

// Error implements error.
func (c LostCause) Error() string { return "lock lost: " + string(c) }

// The causes of a loss. Each is decided when Lost closes, from what the
// Locker saw at that moment; no extra call is made to find out.
const (
	// CauseExpired: a renewal, Refresh or Release was told by the server
	// that the lock is not held (driver.ErrNotHeld), and the driver did
	// not say another owner holds the key. Its TTL ran out on the server
	// before a renewal reached it (a pause, a server clock running fast),
	// or it was deleted (evicted, released by another client with the same
	// owner, a server restarted empty).
	CauseExpired LostCause = "expired"
	// CauseTaken: as CauseExpired, but the driver's answer also matched
	// driver.ErrNotAcquired: another owner holds the key now. Drivers that
	// cannot tell report CauseExpired (of this module's, mem tells).
	CauseTaken LostCause = "taken"
	// CauseDeadline: the safe deadline passed without a successful renewal
	// (renewals failing or stuck, the backend unreachable, the process
	// paused, or WithAutoRenew(false) without a Refresh in time). The loss
	// is presumed: an owner-checked release is sent in case the server
	// still has the lock.
	CauseDeadline LostCause = "deadline"
	// CauseClosed: Locker.Close released the lock. Such an Err also
	// matches ErrClosed.
	CauseClosed LostCause = "closed"
	// CauseMaxHold: the bound set by WithMaxHold passed; renewal stopped
	// and the lock was released.
	CauseMaxHold LostCause = "max_hold"
	// CauseServer: the driver saw the server end the lock on its own and
	// reported it (driver.HoldWatcher): a session that ended, a key
	// deleted, evicted or overwritten.
	CauseServer LostCause = "server"
)

// lostError is the error of a lost lock: Lock.Err, Do's context cause,
// and what Refresh and Release return after the loss.
type lostError struct {
	cause LostCause
	msg   string
	err   error // what the driver reported, or nil
}

func (e *lostError) Error() string {
	s := ErrNotHeld.Error() + " (lost: " + string(e.cause) + "): " + e.msg
	if e.err != nil {
		s += ": " + e.err.Error()
	}
	return s
}

// Unwrap returns ErrNotHeld, the cause and the driver's report, and
// ErrClosed for CauseClosed. A report that matches ErrNotAcquired or a
// context error stays in the text only: a lost lock must not look like a
// failed acquire or a cancelled call.
func (e *lostError) Unwrap() []error {
	errs := []error{ErrNotHeld, e.cause}
	if e.cause == CauseClosed {
		errs = append(errs, ErrClosed)
	}
	if e.err == nil || errors.Is(e.err, ErrNotAcquired) ||
		errors.Is(e.err, context.Canceled) || errors.Is(e.err, context.DeadlineExceeded) {
		return errs
	}
	return append(errs, e.err)
}

// serverLost is the loss reported by a server that answered a renewal,
// Refresh or Release with err, which matches ErrNotHeld.
func serverLost(msg string, err error) *lostError {
	if errors.Is(err, ErrNotAcquired) {
		return &lostError{cause: CauseTaken, msg: msg + ": another owner holds it", err: err}
	}
	return &lostError{cause: CauseExpired, msg: msg + ": expired or deleted", err: err}
}

// wrap adds the "locker: op key:" prefix once, with %w, so that every
// sentinel (ErrUnavailable included) and the driver's own error types stay
// matchable. If ctx is done and err does not already say so, ctx.Err() is
// joined so that errors.Is(err, context.Canceled) holds whatever the driver
// returned.
func wrap(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		err = fmt.Errorf("%w (%w)", cerr, err)
	}
	return prefix(op, key, err)
}

// prefix adds the "locker: op key:" prefix to a non-nil err.
func prefix(op, key string, err error) error {
	if key == "" {
		return fmt.Errorf("locker: %s: %w", op, err)
	}
	return fmt.Errorf("locker: %s %q: %w", op, key, err)
}
