package postgres

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Options configure New. A nil *Options, and every zero field, means the
// default.
type Options struct {
	// Mode is ModeAdvisory (the default, also for "") or ModeLease, as the
	// URL's mode parameter. Anything else is driver.ErrInvalid.
	Mode string
	// Schema holds the token sequence and, in lease mode, the lease table;
	// it is created if missing. Default DefaultSchema.
	Schema string
	// Namespace is hashed with every key (see AdvisoryKey); Lockers
	// coordinate only within one namespace. Default DefaultNamespace. A
	// namespace containing a NUL byte is driver.ErrInvalid.
	Namespace string
	// SweepInterval is how often a lease-mode Locker deletes long-expired
	// rows of the lease table (with ±20% jitter). Default
	// LeaseSweepInterval. Ignored in advisory mode.
	SweepInterval time.Duration
	// SweepAge is how long a lease row stays expired before the sweep
	// deletes it. Default LeaseSweepAge. Ignored in advisory mode.
	SweepAge time.Duration
}

// Locker is the driver.Locker of this package, in the mode Open's URL or
// New's Options chose:
//
//   - advisory (the default): each lock is a session-level advisory lock
//     on a pooled connection pinned to it until release. AcquireWait
//     blocks in the server's lock manager, and WatchHold watches the
//     pinned session (on Linux).
//   - lease: each lock is a row of the lease table <schema>.locker_leases,
//     with an expiry judged by the server's clock; no connection is
//     pinned, so a lease survives its connection, a terminated backend and
//     a crash of the server, works through a transaction-mode pooler such
//     as PgBouncer, and the same owner through another Locker on the same
//     table and namespace refreshes and releases it. AcquireWait waits for
//     a release notification (LISTEN/NOTIFY, not through a pooler) or the
//     holder's remaining TTL; WatchHold reports errors.ErrUnsupported.
//
// It implements driver.BlockingAcquirer, driver.HoldWatcher,
// driver.Inspector, driver.Capable and driver.Pinger in both modes. It is
// safe for concurrent use.
type Locker struct {
	mode  string
	adv   *advisoryLocker // advisory mode
	lease *leaseLocker    // lease mode
}

// Open connects to the PostgreSQL server named by dsn (see the package
// documentation for its format, including mode=advisory|lease), checks the
// server (not a standby, version 14 or later, and in advisory mode not
// behind a pooler) and creates the schema, the token sequence and in lease
// mode the lease table if missing, serialized across processes. The pool it
// creates is closed by Close.
//
// Errors wrap driver.ErrInvalid for a malformed URL or an unknown query
// parameter; driver.ErrUnavailable when the server cannot be reached
// (connection refused or timed out, TLS or authentication failure, no free
// connection slot, the server starting up or shutting down); ErrStandby,
// ErrPooler or ErrServerVersion for an unsuitable server. A role that may
// not create what is missing gets an error naming the DDL to run, and a
// lease table of the wrong shape one naming the shape wanted; other errors
// carry the server's or pgx's message.
func Open(ctx context.Context, dsn string) (*Locker, error) {
	c, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if c.mode == ModeLease {
		l, err := openLease(ctx, c)
		if err != nil {
			return nil, err
		}
		return &Locker{mode: ModeLease, lease: l}, nil
	}
	l, err := openAdvisory(ctx, c)
	if err != nil {
		return nil, err
	}
	return &Locker{mode: ModeAdvisory, adv: l}, nil
}

// New adopts a pool the caller already has, in the mode opts choose (nil
// opts: advisory mode with the defaults): it runs the same checks and
// setup as Open, on ctx. Close does not close the pool. In advisory mode
// each held lock and each blocked AcquireWait takes one connection out of
// the pool until the lock is released, so size the pool for them plus the
// application's own use; in lease mode no connection is held between
// operations.
//
// Errors are those of Open; a nil pool or a bad option wraps
// driver.ErrInvalid.
func New(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*Locker, error) {
	c, err := adoptConfig(pool, opts)
	if err != nil {
		return nil, err
	}
	if c.mode == ModeLease {
		l, err := newLease(ctx, pool, c)
		if err != nil {
			return nil, err
		}
		return &Locker{mode: ModeLease, lease: l}, nil
	}
	l, err := newAdvisory(ctx, pool, c)
	if err != nil {
		return nil, err
	}
	return &Locker{mode: ModeAdvisory, adv: l}, nil
}

// adoptConfig is the configuration of New: opts over the defaults, for a
// pool the caller passed (nil is driver.ErrInvalid).
func adoptConfig(pool *pgxpool.Pool, opts *Options) (*config, error) {
	if pool == nil {
		return nil, fmt.Errorf("postgres: nil pool: %w", driver.ErrInvalid)
	}
	c := &config{schema: DefaultSchema, namespace: DefaultNamespace, mode: ModeAdvisory}
	if opts != nil {
		switch opts.Mode {
		case "", ModeAdvisory:
		case ModeLease:
			c.mode = ModeLease
		default:
			return nil, fmt.Errorf("postgres: mode %q: want %q or %q: %w", opts.Mode, ModeAdvisory, ModeLease, driver.ErrInvalid)
		}
		if opts.Schema != "" {
			c.schema = opts.Schema
		}
		if opts.Namespace != "" {
			c.namespace = opts.Namespace
		}
		if opts.SweepInterval < 0 || opts.SweepAge < 0 {
			return nil, fmt.Errorf("postgres: negative sweep interval or age: %w", driver.ErrInvalid)
		}
		c.sweepEvery, c.sweepAge = opts.SweepInterval, opts.SweepAge
	}
	if err := checkSchema(c.schema); err != nil {
		return nil, err
	}
	if err := checkNamespace(c.namespace); err != nil {
		return nil, err
	}
	return c, nil
}

// Mode returns ModeAdvisory or ModeLease.
func (l *Locker) Mode() string { return l.mode }

// Acquire makes one attempt to take key for owner for ttl. If another owner
// holds key it returns a *driver.HeldError (wrapping
// driver.ErrNotAcquired) with the holder's remaining TTL when the server
// can tell. Acquire by the current owner resets the TTL and returns the
// same token; in advisory mode only through the Locker that took the lock.
//
// In advisory mode it is one statement, pg_try_advisory_lock on a
// connection taken from the pool, that also draws the fencing token from
// the sequence and arms idle_session_timeout = ttl; on success the
// connection stays pinned to the lock. In lease mode it is one statement
// that inserts or takes over the key's row if it is free or expired.
//
// Errors wrap driver.ErrInvalid (empty key or owner, ttl ≤ 0 or > MaxTTL),
// driver.ErrUnavailable (the server could not be reached),
// driver.ErrClosed, ctx.Err(), ErrStandby or ErrPooler; a failure leaves
// nothing held.
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if l.lease != nil {
		return l.lease.Acquire(ctx, key, owner, ttl)
	}
	return l.adv.Acquire(ctx, key, owner, ttl)
}

// Refresh resets the TTL of the lock owner holds. A lock that has ended is
// not revived: Refresh then returns driver.ErrNotHeld. In advisory mode a
// lock belongs to the session that took it, so Refresh through any other
// Locker also returns driver.ErrNotHeld; in lease mode any Locker on the
// same table and namespace refreshes it.
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err(). In advisory mode, if ctx ends while the
// statement is in flight the connection is closed and the lock ends with
// it: the error then wraps both ctx.Err() and driver.ErrNotHeld.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if l.lease != nil {
		return l.lease.Refresh(ctx, key, owner, ttl)
	}
	return l.adv.Refresh(ctx, key, owner, ttl)
}

// Release frees the lock owner holds (owner-checked, one statement). It
// returns driver.ErrNotHeld if owner does not hold key (any more), or, in
// advisory mode, does not hold it through this Locker.
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err(). In advisory mode, on any failure the
// connection is closed, so the server frees the lock anyway (at the latest
// after the TTL if it cannot be reached).
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	if l.lease != nil {
		return l.lease.Release(ctx, key, owner)
	}
	return l.adv.Release(ctx, key, owner)
}

// Inspect reports the current holder of key, or driver.ErrNotHeld if key
// is free. It changes nothing.
//
// Errors wrap driver.ErrNotHeld, driver.ErrInvalid (empty key),
// driver.ErrUnavailable, driver.ErrClosed or ctx.Err().
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if l.lease != nil {
		return l.lease.Inspect(ctx, key)
	}
	return l.adv.Inspect(ctx, key)
}

// Capabilities reports TTLs kept to the millisecond (the minimum is 10ms in
// advisory mode, 1ms in lease mode) and durable tokens (a WAL-logged
// sequence). In advisory mode it also reports LockerBound: a lock belongs to
// the session, so only the Locker that took it can refresh or release it.
func (l *Locker) Capabilities() driver.Capabilities {
	if l.lease != nil {
		return l.lease.Capabilities()
	}
	return l.adv.Capabilities()
}

// Ping makes one round trip to the server on a pooled connection. It
// returns driver.ErrClosed after Close.
func (l *Locker) Ping(ctx context.Context) error {
	if l.lease != nil {
		return l.lease.Ping(ctx)
	}
	return l.adv.Ping(ctx)
}

// Close ends the Locker: in advisory mode every held lock ends at once (its
// pinned connection is closed, and the server frees the lock); in lease
// mode the leases stay until they are released by another Locker or
// expire. Calls in progress are aborted, and the pool is closed if Open
// created it. It is idempotent; later calls of every method return
// driver.ErrClosed.
func (l *Locker) Close() error {
	if l.lease != nil {
		return l.lease.Close()
	}
	return l.adv.Close()
}

// AcquireWait is Acquire that waits until key is granted or ctx is done,
// in which case it returns an error wrapping ctx.Err() and leaves nothing
// held or queued.
//
// In advisory mode it blocks in the server's lock manager
// (pg_advisory_lock): see the package documentation for cancellation and
// for waits that outlive their session. In lease mode it retries Acquire
// when a Release notifies the key (LISTEN/NOTIFY, one listener connection
// per Locker outside the pool; not through a pooler), just after the
// holder's remaining TTL runs out, and at the latest every 2s; while the
// server cannot be reached it retries with backoff from 5ms to 500ms.
//
// Errors are those of Acquire; a wait that ends with ctx after transient
// failures wraps ctx.Err() and names the last failure.
func (l *Locker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if l.lease != nil {
		return l.lease.acquireWait(ctx, key, owner, ttl)
	}
	return l.adv.AcquireWait(ctx, key, owner, ttl)
}

// WatchHold implements driver.HoldWatcher.
//
// In advisory mode it watches the session pinned to the grant of key to
// owner with token, and calls lost once that session ends while the lock
// is held (the backend terminated; the server crashed, restarted or failed
// over; the connection reset or closed by anything in between): at once
// when the holder's socket reports the end (an epoll watch, no traffic),
// and within about a second when it does not, as on a half-open connection
// whose server side was reset while the client side stays open and silent.
// For that, while any lock of the Locker is watched, a session probe runs
// one statement every 200ms, on a connection of its own made with the
// pool's connection settings (outside the pool, closed after 30s without a
// watched lock), that looks up in pg_locks whether each watched lock's
// session still holds it; a look-up that fails, or that reaches another
// server address than the lock's connection, reports nothing. Release and
// Close end the watch first, so they are never reported as a loss. Errors:
// driver.ErrNotHeld if this Locker does not hold key for owner with token
// (any more); driver.ErrClosed; an error matching errors.ErrUnsupported
// outside Linux.
//
// In lease mode a lease outlives its connections and the server's
// restarts, so it returns an error matching errors.ErrUnsupported
// (driver.ErrClosed after Close) and package locker relies on renewal.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	if l.lease != nil {
		l.lease.mu.Lock()
		closed := l.lease.closed
		l.lease.mu.Unlock()
		if closed {
			return nil, driver.ErrClosed
		}
		return nil, fmt.Errorf("postgres: lease mode: leases are not watched: %w", errors.ErrUnsupported)
	}
	return l.adv.WatchHold(key, owner, token, lost)
}

// The lease mode's wait schedule (as package locker's for a driver.Waiter).
const (
	leaseWaitMin      = 5 * time.Millisecond   // first retry delay without notifications
	leaseWaitMax      = 500 * time.Millisecond // cap of that delay
	leaseHeadWaitMax  = 50 * time.Millisecond  // the cap for the first waiter of a shared lock's queue
	leaseWaitFallback = 2 * time.Second        // longest wait for a notification
	leaseExpirySlack  = 2 * time.Millisecond   // added to the holder's remaining TTL
)

// acquireWait is AcquireWait in lease mode.
func (l *leaseLocker) acquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	defer context.AfterFunc(l.ctx, func() { stop(driver.ErrClosed) })()
	if key == "" {
		return 0, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	attempt := func() (uint64, error) { return l.Acquire(ctx, key, owner, ttl) }
	sub := func(ctx context.Context) (<-chan struct{}, func(), error) {
		return l.subscribeID(ctx, leaseID(l.ns, key))
	}
	return l.waitFor(ctx, sub, attempt, func(inAttempt bool) {
		if inAttempt {
			l.releaseAfterWait(key, owner)
		}
	})
}

// waitFor is a lease-mode wait for a row (of either table): it makes
// attempt until it grants, fails with an error other than a refusal or
// ErrUnavailable, or ctx ends, retrying when the wake-up subscribed to with
// sub fires, just after the holder's remaining TTL (unless the refusal is
// a behindInQueue and wake-ups work: the waiters ahead are woken first,
// and they wake those behind them), and at the latest every
// leaseWaitFallback (on a backoff from leaseWaitMin to leaseWaitMax
// without notifications or while the server cannot be reached; to
// leaseHeadWaitMax for the first waiter of a shared lock's queue, whom the
// waiters behind it wait for). When it
// gives up it calls giveUp, telling whether ctx ended during an attempt.
func (l *leaseLocker) waitFor(ctx context.Context, sub func(context.Context) (<-chan struct{}, func(), error),
	attempt func() (uint64, error), giveUp func(inAttempt bool)) (uint64, error) {
	wake, cancel, err := sub(ctx)
	switch {
	case err == nil:
		defer cancel()
	case ctx.Err() != nil:
		return 0, err
	case errors.Is(err, driver.ErrClosed):
		return 0, err
	default:
		wake = nil // no notifications (a pooler): retry on the schedule
	}
	delay := leaseWaitMin
	var lastErr error
	for {
		drainWake(wake)
		tok, err := attempt()
		var held *driver.HeldError
		wait := leaseWaitFallback
		switch {
		case err == nil:
			return tok, nil
		case ctx.Err() != nil:
			giveUp(true)
			return 0, l.waitEnded(ctx, lastErr)
		case errors.As(err, &held):
			if wake == nil {
				limit := leaseWaitMax
				if errors.As(err, new(firstInQueue)) {
					limit = leaseHeadWaitMax
				}
				wait = min(delay, limit)
				delay = min(2*delay, limit)
			}
			if r := held.Remaining; r > 0 && r+leaseExpirySlack < wait && (wake == nil || !errors.As(err, new(behindInQueue))) {
				wait = r + leaseExpirySlack
			}
		case errors.Is(err, driver.ErrUnavailable):
			lastErr, wait = err, delay
			delay = min(2*delay, leaseWaitMax)
		default:
			giveUp(false)
			return 0, err
		}
		if !sleepWake(ctx, wake, wait) {
			giveUp(false)
			return 0, l.waitEnded(ctx, lastErr)
		}
	}
}

// waitEnded is the error of a lease wait whose ctx ended.
func (l *leaseLocker) waitEnded(ctx context.Context, lastErr error) error {
	if lastErr != nil {
		return l.fail(ctx, "acquire", fmt.Errorf("%w (while waiting, last error: %w)", context.Cause(ctx), lastErr))
	}
	return l.fail(ctx, "acquire", context.Cause(ctx))
}

// releaseAfterWait undoes a grant that may have raced the end of a wait's
// context (the statement committed, its reply was not read): an
// owner-checked release, bounded in time; a failure leaves the lease to
// expire.
func (l *leaseLocker) releaseAfterWait(key, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = l.Release(ctx, key, owner)
}

// sleepWake waits for d (with ±10% jitter), a wake-up or ctx; it reports
// whether ctx is still live.
func sleepWake(ctx context.Context, wake <-chan struct{}, d time.Duration) bool {
	d += time.Duration(rand.Int64N(int64(d)/5+1)) - d/10
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
		return false
	}
	return true
}

// drainWake empties a wake-up channel; wake-ups that came before an attempt
// are answered by it.
func drainWake(wake <-chan struct{}) {
	for {
		select {
		case <-wake:
		default:
			return
		}
	}
}

// WatchChanges implements driver.ChangeWatcher.
//
// In lease mode every grant of an election's key (under
// locker.ElectionPrefix: an insert, or a takeover of an expired row) and
// every release is announced with NOTIFY when its statement commits,
// and a listener connection of this Locker (one for all its watches,
// opened by the first, outside the pool so that it takes none of its
// connections) LISTENs for them: changed is called within a round trip of
// the commit. An expiry is not announced. After the listener reconnects,
// changed is called once. Behind a pooler LISTEN does not work, and it
// returns an error saying so, matching errors.ErrUnsupported; for a key
// outside locker.ElectionPrefix,
// whose grants are not announced (a NOTIFY serializes the commits that
// send one, which plain locks need not pay), it returns an error matching
// errors.ErrUnsupported.
//
// In advisory mode a lock changes hands in the server's lock manager, which
// announces nothing: it returns an error matching errors.ErrUnsupported.
//
// Errors also: driver.ErrInvalid for an empty key, driver.ErrClosed,
// ctx.Err() if ctx ends before the listener's first connection attempt
// has finished.
func (l *Locker) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if l.lease != nil {
		return l.lease.watchChanges(ctx, key, changed)
	}
	return nil, fmt.Errorf("postgres: advisory mode announces no grants or releases: %w", errors.ErrUnsupported)
}
