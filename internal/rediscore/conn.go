package rediscore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-locker/locker/driver"
)

// Conn is one Redis deployment (a single node, a Cluster, or a
// Sentinel-managed master) as the scripts see it. Each driver implements it
// for its client.
type Conn interface {
	// Run executes s by EVALSHA, falling back to EVAL (which also loads the
	// script) on NOSCRIPT. Replies are converted to int64, string, []any
	// (nested) or nil (for a nil reply). Errors wrap ctx.Err() once ctx is
	// done.
	Run(ctx context.Context, s *Script, keys []string, args ...string) (any, error)
	// RunBatch runs s once per call in one round trip (a pipeline of
	// EVALSHA; on a Cluster, one pipeline per node, in parallel), with
	// EVAL for the calls that got NOSCRIPT, and returns one Reply per
	// call, in order, converted as Run converts them. A failure of the
	// whole pipeline is every call's error.
	RunBatch(ctx context.Context, s *Script, calls []Call) []Reply
	// Ping makes one round trip.
	Ping(ctx context.Context) error
	// Close closes the client if the Conn owns it (not when it adopted a
	// user's client).
	Close() error
}

// TimedConn is implemented by a Conn whose calls each end within the
// client's own timeouts, whatever their context (Timed reports whether they
// do). A call that must outlive its caller's context then needs no deadline
// of its own.
type TimedConn interface {
	Timed() bool
}

// ctxErr returns an error wrapping ctx.Err() when ctx is done, so callers
// see errors.Is(err, context.Canceled/DeadlineExceeded) even when the client
// reported the cancellation in its own words.
func (p prefix) ctxErr(ctx context.Context, op string, err error) error {
	SettleDeadline(ctx, err)
	if cerr := ctx.Err(); cerr != nil {
		if err == nil || err == cerr {
			return p.errorf("%s: %w", op, cerr)
		}
		return p.errorf("%s: %w (%v)", op, cerr, err)
	}
	return p.errorf("%s: %w", op, err)
}

// SettleDeadline waits, when a call failed within 10ms of ctx's deadline,
// until ctx reports it is done. Clients turn ctx's deadline into a socket
// deadline, which can fire a moment before ctx's own timer; without this
// the caller would get "i/o timeout" where the contract promises an error
// matching context.DeadlineExceeded. It returns at once otherwise.
func SettleDeadline(ctx context.Context, err error) {
	if err == nil || ctx.Err() != nil {
		return
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < 10*time.Millisecond {
		<-ctx.Done() // at most ~10ms: a context with a deadline ends at it
	}
}

// parseToken converts a token reply (bulk string or integer) to uint64.
func (p prefix) parseToken(v any) (uint64, error) {
	switch x := v.(type) {
	case string:
		n, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return 0, p.errorf("malformed token %q", x)
		}
		return n, nil
	case int64:
		if x < 0 {
			return 0, p.errorf("malformed token %d", x)
		}
		return uint64(x), nil
	}
	return 0, p.errorf("unexpected token reply %T", v)
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// ErrHubClosed is returned by Hub.Subscribe after Hub.Close. It wraps
// driver.ErrClosed.
var ErrHubClosed = fmt.Errorf("redis: subscription hub closed: %w", driver.ErrClosed)
