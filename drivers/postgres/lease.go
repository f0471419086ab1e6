package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the lease table's clean-up (see Options).
const (
	// LeaseSweepInterval is how often each lease-mode Locker deletes long-expired
	// rows (with ±20% jitter).
	LeaseSweepInterval = time.Minute
	// LeaseSweepAge is how long a row stays expired before it is deleted.
	LeaseSweepAge = 10 * time.Minute
)

// leaseLocker is a Locker in lease mode (mode=lease): each lock
// is a row of the lease table <schema>.locker_leases, with an expiry judged
// by the server's clock. No connection is pinned: every operation is one
// autocommit statement on any pooled connection, so a lease survives the
// connection that took it, a terminated backend and a crash of the server,
// works through a transaction-mode pooler such as PgBouncer, and one
// process can hold many more locks than the server has connections. Any
// Locker on the same table and namespace acts for an owner: the same owner
// string through another leaseLocker refreshes and releases the lock.
//
// Its waits are woken by LISTEN/NOTIFY (see subscribe). It is safe for
// concurrent use.
type leaseLocker struct {
	pool    *pgxpool.Pool
	ownPool bool
	ns      string
	table   string
	sql     leaseStatements
	shsql   sharedLeaseStatements
	mode    []any // prepended to every statement's arguments
	pooler  bool  // the connection goes through a pooler
	retries int   // see leaseRetries

	ctx    context.Context // done once Close begins
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	ops    sync.WaitGroup
	lis    *listener // started by the first subscribe
	clis   *listener // started by the first watchChanges: releases and grants
	bg     sync.WaitGroup
	ren    leaseRenewer // batches Refresh (lease_renew.go)
}

// openLease opens a lease-mode Locker on a pool of its own.
func openLease(ctx context.Context, c *config) (*leaseLocker, error) {
	pool, err := newPool(ctx, c)
	if err != nil {
		return nil, err
	}
	l, err := newLease(ctx, pool, c)
	if err != nil {
		pool.Close()
		return nil, err
	}
	l.ownPool = true
	return l, nil
}

func newLease(ctx context.Context, pool *pgxpool.Pool, c *config) (*leaseLocker, error) {
	r, err := setup(ctx, pool, c.schema, true)
	if err != nil {
		return nil, withMode(err, ModeLease, pool.Config().MaxConns)
	}
	l := &leaseLocker{pool: pool, ns: c.namespace, table: r.table, sql: buildLeaseStatements(r.table, r.seq), shsql: buildSharedLeaseStatements(c.schema, r.shared), pooler: r.pooler}
	l.retries = leaseRetries(pool)
	if r.pooler {
		// A transaction-mode pooler may run each statement on another
		// server session: no named prepared statements.
		l.mode = []any{pgx.QueryExecModeExec}
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	every, age := c.sweepEvery, c.sweepAge
	if every <= 0 {
		every = LeaseSweepInterval
	}
	if age <= 0 {
		age = LeaseSweepAge
	}
	l.bg.Add(1)
	go l.sweeper(every, age)
	return l, nil
}

// args prepends the query mode to a statement's arguments.
func (l *leaseLocker) args(a ...any) []any {
	if l.mode == nil {
		return a
	}
	return append(append(make([]any, 0, len(a)+1), l.mode...), a...)
}

// leaseID is a key's id in the lease table: the first 16 bytes of
// SHA-256(namespace || 0x00 || key).
func leaseID(ns, key string) []byte {
	h := sha256.New()
	h.Write([]byte(ns))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return h.Sum(nil)[:16]
}

// Capabilities reports TTLs kept to the millisecond from 1ms, durable tokens
// (the sequence, and the grant itself, are flushed to the WAL before a grant
// is reported) and that locks belong to their owner, not to the Locker.
func (l *leaseLocker) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: time.Millisecond, TTLGranularity: time.Millisecond, DurableTokens: true}
}

// leaseRetries is how many times a lease statement is retried at once on
// another connection when the pooled one turns out broken (the server
// restarted, the backend was terminated, the connections were reset): one
// more than the pool can hold, since a reset can break every pooled
// connection at once and the pool hands each one out before it finds out.
func leaseRetries(pool *pgxpool.Pool) int {
	return int(pool.Config().MaxConns) + 1
}

// retryable reports an error after which a statement may be sent again on
// another connection: the session broke, so the statement either never ran
// or (for the idempotent acquire and refresh) may run again.
func retryable(err error) bool {
	return lostSession(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// Acquire makes one attempt to take key for owner for ttl: one statement
// that inserts the key's row or takes over an expired one, drawing the
// fencing token from the sequence, with the expiry computed by the server's
// clock. If another owner holds key it returns a *driver.HeldError with the
// holder's remaining TTL. Acquire by the current owner, through any
// leaseLocker, resets the TTL and returns the same token.
//
// Errors wrap driver.ErrInvalid (empty key or owner, ttl ≤ 0 or > MaxTTL),
// driver.ErrNotAcquired, driver.ErrUnavailable, driver.ErrClosed, ctx.Err()
// or ErrStandby.
func (l *leaseLocker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	ms, err := checkCall(key, owner, ttl)
	if err != nil {
		return 0, err
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	id := leaseID(l.ns, key)
	// A statement cut short by ctx may still commit on the server (a pooler
	// runs it to its end), after any clean-up the caller sends. So the
	// statement runs until its reply, cancelGrace past ctx at most, and a
	// grant that arrives once ctx is done is undone here.
	qctx, qcancel := outlive(ctx, cancelGrace)
	defer qcancel()
	stmt := l.sql.acquire
	if announced(key) {
		stmt = l.sql.acquireNotify
	}
	for tries := 0; ; tries++ {
		var tok, rem *int64
		err := l.pool.QueryRow(qctx, stmt, l.args(id, []byte(key), []byte(owner), ms)...).Scan(&tok, &rem)
		switch {
		case err == nil && tok != nil && ctx.Err() != nil:
			payload := hex.EncodeToString(id)
			_ = l.pool.QueryRow(qctx, l.sql.release, l.args(id, []byte(owner), payload)...).Scan(new(string))
			return 0, l.fail(ctx, "acquire", ctx.Err())
		case err == nil && tok != nil:
			if *tok <= 0 {
				return 0, errors.New("postgres: acquire: unexpected token")
			}
			return uint64(*tok), nil
		case err == nil:
			var r time.Duration
			if rem != nil && *rem > 0 {
				r = time.Duration(*rem) * time.Millisecond
			}
			return 0, &driver.HeldError{Remaining: r}
		case errors.Is(err, pgx.ErrNoRows):
			return 0, &driver.HeldError{}
		case retryable(err) && ctx.Err() == nil && tries < l.retries:
			continue
		}
		return 0, l.fail(ctx, "acquire", sqlError(unavailable(err)))
	}
}

// Refresh resets the TTL of the lock owner holds, through any leaseLocker:
// owner-checked, and never reviving an expired row. Refreshes that fall
// due together share one statement on a connection reserved for renewals
// (see lease_renew.go), so they never wait for a pooled connection behind
// acquires; each gets its own answer.
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err().
func (l *leaseLocker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	ms, err := checkCall(key, owner, ttl)
	if err != nil {
		return err
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	switch err := l.renew(ctx, leaseID(l.ns, key), []byte(owner), ms); {
	case err == nil:
		return nil
	case errors.Is(err, errBatchNotHeld):
		return notHeld("refresh", key)
	default:
		return l.fail(ctx, "refresh", sqlError(unavailable(err)))
	}
}

// Release frees the lock owner holds, through any leaseLocker: one
// owner-checked statement that marks the row expired and notifies waiters.
// It returns driver.ErrNotHeld if owner does not hold key (any more).
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrUnavailable,
// driver.ErrClosed or ctx.Err(). A failed Release leaves the lock to expire.
func (l *leaseLocker) Release(ctx context.Context, key, owner string) error {
	if _, err := checkCall(key, owner, time.Millisecond); err != nil {
		return err
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	id := leaseID(l.ns, key)
	payload := hex.EncodeToString(id)
	for tries := 0; ; tries++ {
		var s string
		err := l.pool.QueryRow(ctx, l.sql.release, l.args(id, []byte(owner), payload)...).Scan(&s)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, pgx.ErrNoRows):
			return notHeld("release", key)
		case (sessionKilled(err) || pgconn.SafeToRetry(err)) && ctx.Err() == nil && tries < l.retries:
			// The statement did not run: try another connection.
			continue
		}
		return l.fail(ctx, "release", sqlError(unavailable(err)))
	}
}

// Inspect reports the live holder of key from the lease table: its owner,
// token and remaining TTL by the server's clock.
//
// Errors: driver.ErrNotHeld if no one holds key; driver.ErrInvalid for an
// empty key; driver.ErrUnavailable; driver.ErrClosed; ctx.Err().
func (l *leaseLocker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if key == "" {
		return driver.Info{}, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return driver.Info{}, err
	}
	defer done()
	var owner []byte
	var tok, rem int64
	for tries := 0; ; tries++ {
		err = l.pool.QueryRow(ctx, l.sql.inspect, l.args(leaseID(l.ns, key))...).Scan(&owner, &tok, &rem)
		if err == nil || !retryable(err) || ctx.Err() != nil || tries >= l.retries {
			break
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{}, notHeld("inspect", key)
	}
	if err != nil {
		return driver.Info{}, l.fail(ctx, "inspect", unavailable(err))
	}
	return driver.Info{Owner: string(owner), Token: uint64(tok), Remaining: max(time.Duration(rem)*time.Millisecond, time.Millisecond)}, nil
}

// Ping makes one round trip to the server on a pooled connection. It returns
// driver.ErrClosed after Close.
func (l *leaseLocker) Ping(ctx context.Context) error {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := l.pool.Ping(ctx); err != nil {
		return l.fail(ctx, "ping", unavailable(err))
	}
	return nil
}

// Close stops the listener and the sweeper, aborts calls in progress and
// closes the pool if Open created it. Locks still held stay in the
// table until they expire. It is idempotent; later calls of every method
// return driver.ErrClosed.
func (l *leaseLocker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	lis, clis := l.lis, l.clis
	l.lis, l.clis = nil, nil
	l.mu.Unlock()
	l.cancel()
	l.ops.Wait()
	for _, s := range []*listener{lis, clis} {
		if s != nil {
			s.close()
		}
	}
	l.bg.Wait()
	l.closeRenewConn()
	if l.ownPool {
		l.pool.Close()
	}
	return nil
}

// sweeper deletes rows expired for longer than age, every interval (±20%),
// until Close.
func (l *leaseLocker) sweeper(interval, age time.Duration) {
	defer l.bg.Done()
	for {
		d := time.Duration(float64(interval) * (0.8 + 0.4*rand.Float64()))
		t := time.NewTimer(d)
		select {
		case <-l.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(l.ctx, interval)
		_, _ = l.sweep(ctx, age)
		_, _ = l.sweepShared(ctx, age)
		cancel()
	}
}

// sweep deletes the rows expired for longer than age and returns how many.
func (l *leaseLocker) sweep(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := l.pool.Exec(ctx, l.sql.sweep, l.args(age.Milliseconds())...)
	return tag.RowsAffected(), err
}

// begin starts an operation: it fails once Close has begun, and returns a
// context that is also cancelled (with cause driver.ErrClosed) by Close.
func (l *leaseLocker) begin(ctx context.Context) (context.Context, func(), error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, driver.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		l.mu.Unlock()
		return nil, nil, fmt.Errorf("postgres: %w", err)
	}
	l.ops.Add(1)
	l.mu.Unlock()
	ctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(l.ctx, func() { cancel(driver.ErrClosed) })
	return ctx, func() {
		stop()
		cancel(nil)
		l.ops.Done()
	}, nil
}

// fail wraps err from operation op. When ctx is done it reports why: Close
// (driver.ErrClosed) or the caller's context.
func (l *leaseLocker) fail(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("postgres: %s: %w", op, context.Cause(ctx))
	}
	return fmt.Errorf("postgres: %s: %w", op, withMode(err, ModeLease, l.pool.Config().MaxConns))
}

// checkCall validates the arguments of a call and returns the TTL in ms.
func checkCall(key, owner string, ttl time.Duration) (int64, error) {
	if key == "" {
		return 0, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	if owner == "" {
		return 0, fmt.Errorf("postgres: empty owner: %w", driver.ErrInvalid)
	}
	return ttlMillis(ttl)
}

// outlive returns a context that ends grace after ctx does (or when the
// returned cancel is called), for a statement whose reply must be known.
func outlive(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	g, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return g, func() {
		stop()
		cancel()
	}
}
