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
	// ErrClosed is returned by every call on a Locker after Close, and by
	// an Acquire that was waiting when Close was called.
	ErrClosed = driver.ErrClosed
	// ErrInvalid is returned, before any I/O, for an empty key, a zero or
	// negative TTL, a malformed URL or an unknown URL query parameter.
	ErrInvalid = driver.ErrInvalid
	// ErrUnavailable is matched by errors from a backend that could not be
	// reached at all (refused, unreachable, TLS or authentication failure
	// while connecting, no Redlock quorum), as opposed to ErrNotAcquired,
	// which means the backend answered that someone else holds the key.
	ErrUnavailable = driver.ErrUnavailable
)

// wrap adds the "locker: op key:" prefix once. If ctx is done and err does not
// already say so, ctx.Err() is joined so that errors.Is(err,
// context.Canceled) holds whatever the driver returned.
func wrap(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if ctx != nil {
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("%w (%w)", cerr, err)
		}
	}
	if key == "" {
		return fmt.Errorf("locker: %s: %w", op, err)
	}
	return fmt.Errorf("locker: %s %q: %w", op, key, err)
}
