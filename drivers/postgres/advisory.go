package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// cancelGrace bounds how long a cancelled AcquireWait waits for the server to
// act on the cancel request before it closes the connection instead.
const cancelGrace = 250 * time.Millisecond

// hold is a lock this Locker holds: a pooled connection pinned to it until
// release, with what is needed to restore the session on release, and the
// watch on its session (see WatchHold).
type hold struct {
	key     string
	owner   string
	token   uint64
	conn    *pgxpool.Conn
	origIST string            // idle_session_timeout before the grant
	origApp string            // application_name before the grant
	adv     int64             // the advisory key
	pid     uint32            // the session's backend process id
	server  string            // the server's address, as the connection reached it
	mode    driver.SharedMode // a shared hold's mode; 0 for a mutex

	// Guarded by Locker.mu.
	mon       *sessionWatch   // the socket watch; nil if unwatched
	listeners []holdListener  // WatchHold callbacks; nil if unwatched
	one       [1]holdListener // listeners' first backing array
	gone      bool            // the session was seen to end
}

// holdListener is one WatchHold callback on a hold.
type holdListener struct {
	id   uint64
	lost func(error)
}

// call holds the arguments of one acquire, computed once.
type call struct {
	key, owner string
	ttl        time.Duration
	ttlMS      int64
	adv        int64
	mode       driver.SharedMode // a shared hold's mode; 0 for the mutex
	limit      int               // a permit's semaphore limit
	gated      bool              // a permit's try by the session that holds the gate
}

func (l *advisoryLocker) newCall(key, owner string, ttl time.Duration) (*call, error) {
	if key == "" {
		return nil, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	if owner == "" {
		return nil, fmt.Errorf("postgres: empty owner: %w", driver.ErrInvalid)
	}
	ms, err := ttlMillis(ttl)
	if err != nil {
		return nil, err
	}
	return &call{key: key, owner: owner, ttl: ttl, ttlMS: ms, adv: AdvisoryKey(l.ns, key)}, nil
}

// ttlMillis rounds ttl up to whole milliseconds (never down: the lock must
// not end before its TTL).
func ttlMillis(ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, fmt.Errorf("postgres: TTL %v: must be positive: %w", ttl, driver.ErrInvalid)
	}
	if ttl > MaxTTL {
		return 0, fmt.Errorf("postgres: TTL %v: longer than %v (idle_session_timeout limit): %w", ttl, MaxTTL, driver.ErrInvalid)
	}
	return int64((ttl + time.Millisecond - 1) / time.Millisecond), nil
}

// Acquire makes one attempt to take key for owner for ttl: a single
// statement, pg_try_advisory_lock on a connection taken from the pool, that
// also draws the fencing token from the sequence and arms
// idle_session_timeout = ttl. On success the connection stays pinned to the
// lock. If another session holds key it returns a *driver.HeldError (wrapping
// driver.ErrNotAcquired) with the holder's remaining TTL when the server can
// tell. Acquire by the current owner through this Locker is a Refresh that
// returns the same token.
//
// Errors wrap driver.ErrInvalid (empty key or owner, ttl ≤ 0 or > MaxTTL),
// driver.ErrUnavailable (the server could not be reached: refused,
// unreachable, TLS or authentication failure, no free connection slot),
// driver.ErrClosed, ctx.Err(), ErrStandby or ErrPooler; a failure leaves
// nothing held (a connection in doubt is closed, which ends its session).
// When ctx ends during the statement, a grant it made is undone before
// Acquire returns, as for AcquireWait.
func (l *advisoryLocker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.acquire(ctx, key, owner, ttl, false)
}

// AcquireWait is Acquire that blocks in the server's lock manager
// (pg_advisory_lock) until key is granted or ctx is done. Cancellation sends
// the server a cancel request, which removes the wait from the lock queue,
// and a grant that raced with it is unlocked before AcquireWait returns; if
// the server does not act on the cancel request within 250ms, the
// connection is closed and its backend, if it still waits for or holds the
// key, is terminated from another connection and waited for. Either way,
// once AcquireWait returns its session neither waits for nor holds key
// (this clean-up is bounded by 1s, past which the server ends the session
// once it notices the closed connection). While it waits it holds one
// connection.
//
// Once the wait has reached the server, losing its session (a terminated
// backend, a server crash or restart, a reset connection) does not end it:
// the wait is made again on a new connection, with backoff from 10ms to 1s
// while the server cannot be reached, until ctx is done (the error then
// wraps ctx.Err() and names the last failure).
//
// Errors are those of Acquire, except driver.ErrNotAcquired.
func (l *advisoryLocker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.acquire(ctx, key, owner, ttl, true)
}

// Backoff of AcquireWait while it waits for the server to come back.
const (
	rewaitMin = 10 * time.Millisecond
	rewaitMax = time.Second
)

func (l *advisoryLocker) acquire(ctx context.Context, key, owner string, ttl time.Duration, wait bool) (uint64, error) {
	c, err := l.newCall(key, owner, ttl)
	if err != nil {
		return 0, err
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	s := l.getSlot(mutexID(key))
	defer l.putSlot(mutexID(key), s)
	if tok, ok, err := l.reacquire(ctx, s, c); ok || err != nil {
		return tok, err
	}
	h, err := l.grant(ctx, c, wait)
	if err != nil {
		return 0, err
	}
	h.key = key
	l.install(s, h)
	return h.token, nil
}

// reacquire is Acquire by the current owner, which is idempotent: it
// refreshes the hold and returns the same token (ok). A hold whose session
// is gone is dropped, and the caller goes on to a fresh grant (not ok, no
// error).
func (l *advisoryLocker) reacquire(ctx context.Context, s *slot, c *call) (tok uint64, ok bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	if h == nil || h.owner != c.owner {
		return 0, false, nil
	}
	err = l.refreshLocked(ctx, s, c)
	if err == nil {
		return h.token, true, nil
	}
	if !errors.Is(err, driver.ErrNotHeld) || ctx.Err() != nil {
		return 0, false, l.fail(ctx, "acquire", err)
	}
	return 0, false, nil
}

// retryState is what grant remembers across the connections it tries.
type retryState struct {
	waited  bool          // a wait reached the server and its session was lost
	delay   time.Duration // backoff while the server cannot be reached
	lastErr error         // why the last wait was lost
	tries   int           // fresh connections tried after a lost session
}

// grant takes the lock on a pooled connection (waiting in the server if
// wait), and makes the attempt again on a fresh connection where the
// session was lost under it (see AcquireWait and Acquire).
func (l *advisoryLocker) grant(ctx context.Context, c *call, wait bool) (*hold, error) {
	st := &retryState{delay: rewaitMin}
	for {
		conn, err := l.pool.Acquire(ctx)
		if err != nil {
			if st.waited && ctx.Err() == nil && l.pause(ctx, &st.delay) {
				st.lastErr = err
				continue
			}
			if st.waited && ctx.Err() != nil {
				return nil, l.fail(ctx, "acquire", fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), unavailable(st.lastErr)))
			}
			return nil, l.fail(ctx, "acquire", unavailable(err))
		}
		var h *hold
		var retry bool
		if wait {
			h, retry, err = l.waitOn(ctx, conn, c)
		} else {
			h, err = l.tryOn(ctx, conn, c)
		}
		if retry {
			if err := l.rewait(ctx, st, err); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			if !wait && lostSession(err) && ctx.Err() == nil && st.tries < 3 {
				// A pooled connection whose server went away: the
				// statement never ran on a live session, so nothing is
				// held. Try a fresh connection, which tells whether the
				// server can be reached.
				st.tries++
				continue
			}
			if lostSession(err) {
				return nil, fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
			}
			return nil, err
		}
		return h, nil
	}
}

// rewait decides about a wait that waitOn says to make again, err saying
// why (nil: the session's own lock_timeout or statement_timeout): it
// returns nil to go on with a fresh connection, after a pause where the
// server must come back, or the error that ends the acquire.
func (l *advisoryLocker) rewait(ctx context.Context, st *retryState, err error) error {
	switch {
	case err == nil:
	case sessionKilled(err):
		// The server ended the wait's session (terminated, crashed,
		// shutting down): wait again once it is back.
		st.waited, st.lastErr = true, err
		if !l.pause(ctx, &st.delay) {
			return l.fail(ctx, "acquire", fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), err))
		}
	case st.waited:
		st.lastErr = err
		if !l.pause(ctx, &st.delay) {
			return l.fail(ctx, "acquire", fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), err))
		}
	case st.tries < 3:
		// The connection broke under the wait (a reset, a crashed
		// server, or a dead pooled connection): try a fresh one at once,
		// and if the server cannot be reached, wait for it to come back
		// as for a killed session.
		st.tries++
		st.waited, st.lastErr = true, err
	default:
		return l.fail(ctx, "acquire", fmt.Errorf("%w: %w", driver.ErrUnavailable, err))
	}
	return nil
}

// install makes h, a new grant, the hold of s. A hold it replaces lost its
// session (we were granted the lock, so the old session is gone): its
// watchers are told and its connection dropped.
func (l *advisoryLocker) install(s *slot, h *hold) {
	s.mu.Lock()
	old := s.h
	l.setHold(s, h)
	s.mu.Unlock()
	if old != nil {
		l.reportGone(old, errors.New("the session ended (the key was granted again)"))
		destroy(old.conn)
	}
}

// pause sleeps for *delay (then doubles it, up to rewaitMax) unless ctx is
// done first; it reports whether ctx is still live.
func (l *advisoryLocker) pause(ctx context.Context, delay *time.Duration) bool {
	t := time.NewTimer(*delay)
	defer t.Stop()
	*delay = min(2**delay, rewaitMax)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// acquireRow is the result of the acquire statement.
type acquireRow struct {
	pooler           bool          // the backend is not the one we connected to
	granted          bool          // the lock was taken
	token            uint64        // if granted
	origIST, origApp string        // if granted: settings to restore on release
	remaining        time.Duration // if refused: the holder's TTL left, 0 if unknown
}

// The connection's CustomData key under which the TTL (ms) its TCP settings
// were last raised for is kept (see tcpSettings).
const tcpDataKey = "locker.tcp_ttl_ms"

// needTCP reports whether conn's TCP settings must be raised for ttlMS.
func needTCP(conn *pgxpool.Conn, ttlMS int64) bool {
	have, _ := conn.Conn().PgConn().CustomData()[tcpDataKey].(int64)
	return have < ttlMS
}

// tcpRaised records that conn's TCP settings now cover ttlMS.
func tcpRaised(conn *pgxpool.Conn, ttlMS int64) {
	conn.Conn().PgConn().CustomData()[tcpDataKey] = ttlMS
}

// keepaliveIdle is tcp_keepalives_idle for a TTL: whole seconds, rounded up,
// within the range Linux accepts.
func keepaliveIdle(ttlMS int64) string {
	return strconv.FormatInt(min(max((ttlMS+999)/1000, 1), 32767), 10)
}

func (l *advisoryLocker) run(ctx context.Context, conn *pgxpool.Conn, wait bool, c *call) (*acquireRow, error) {
	var (
		ok                  *bool
		tok                 *int64
		ist, app, set, held *string
	)
	pid := conn.Conn().PgConn().PID()
	args := []any{c.adv, int64(pid), strconv.FormatInt(c.ttlMS, 10),
		strconv.FormatInt(c.ttlMS, 16), ownerTag(c.owner)}
	tcp := needTCP(conn, c.ttlMS)
	sql := l.sql.acquire[boolIndex(wait)][boolIndex(tcp)]
	if c.mode != 0 {
		sql = l.shsql.acquire[c.mode][boolIndex(wait)][boolIndex(tcp)]
		if c.gated {
			sql = l.shsql.permitRetry[boolIndex(tcp)]
		}
		if c.mode == driver.SharedPermit {
			args = append(args, int32(c.limit))
		}
	}
	if tcp {
		args = append(args, keepaliveIdle(c.ttlMS))
	}
	if err := conn.QueryRow(ctx, sql, args...).Scan(&ok, &tok, &ist, &app, &set); err != nil {
		return nil, err
	}
	r := &acquireRow{}
	switch {
	case ok == nil:
		r.pooler = true
	case *ok:
		if tok == nil || *tok <= 0 || ist == nil || app == nil {
			return nil, errors.New("unexpected reply to the acquire statement")
		}
		if tcp {
			tcpRaised(conn, c.ttlMS)
		}
		r.granted = true
		r.token = uint64(*tok)
		r.origIST, r.origApp = *ist, *app
	case !wait && c.mode == 0:
		// Refused: how long the holder has left, if the server can tell
		// (a failed look-up only leaves it unknown).
		err := conn.QueryRow(ctx, l.sql.holder, uint32(uint64(c.adv)>>32), uint32(uint64(c.adv))).Scan(&held)
		if err == nil && held != nil {
			r.remaining = parseHolder(*held)
		}
	}
	return r, nil
}

func boolIndex(b bool) int {
	if b {
		return 1
	}
	return 0
}

// parseHolder reads the holder column of the acquire statement,
// "<state>/<idle ms>/<application_name>", into the holder's remaining TTL,
// or 0 if unknown.
func parseHolder(s string) time.Duration {
	state, rest, ok1 := strings.Cut(s, "/")
	idleS, app, ok2 := strings.Cut(rest, "/")
	idle, err := strconv.ParseInt(idleS, 10, 64)
	if !ok1 || !ok2 || err != nil {
		return 0
	}
	_, ttlMS, _, ok := parseAppName(app)
	if !ok {
		return 0
	}
	rem := time.Duration(ttlMS) * time.Millisecond
	if state == "idle" {
		rem -= time.Duration(idle) * time.Millisecond
	}
	return max(rem, 0)
}

// tryOn runs the non-blocking acquire statement on conn. On a grant conn is
// pinned in the returned hold; otherwise it goes back to the pool (untouched:
// nothing in the statement changes the session unless the lock is granted)
// or, after an error, is closed.
func (l *advisoryLocker) tryOn(ctx context.Context, conn *pgxpool.Conn, c *call) (*hold, error) {
	r, cut, err := l.runGuarded(ctx, conn, false, c)
	if cut {
		l.abandon(conn, c.adv)
		return nil, l.fail(ctx, "acquire", ctx.Err())
	}
	if err != nil {
		destroy(conn)
		return nil, l.fail(ctx, "acquire", sqlError(err))
	}
	if r.pooler {
		destroy(conn)
		return nil, ErrPooler
	}
	if !r.granted {
		conn.Release()
		return nil, &driver.HeldError{Remaining: r.remaining}
	}
	return newHold(conn, c, r), nil
}

// waitOn runs the blocking acquire statement on conn; see AcquireWait. retry
// reports that the wait should be made again on a fresh connection: it was
// ended by the session's own lock_timeout or statement_timeout (err nil), or
// its session was lost (err says how).
func (l *advisoryLocker) waitOn(ctx context.Context, conn *pgxpool.Conn, c *call) (h *hold, retry bool, err error) {
	r, cut, err := l.runGuarded(ctx, conn, true, c)
	if cut {
		// ctx is done: whatever happened, leave nothing queued or held.
		l.abandon(conn, c.adv)
		return nil, false, l.fail(ctx, "acquire", ctx.Err())
	}
	if err != nil {
		lost := conn.Conn().IsClosed()
		destroy(conn)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && (pgErr.Code == "55P03" || pgErr.Code == "57014") {
			return nil, true, nil // lock_timeout or statement_timeout
		}
		if sessionKilled(err) || lost && !errors.As(err, &pgErr) {
			return nil, true, err
		}
		return nil, false, l.fail(ctx, "acquire", sqlError(err))
	}
	if r.pooler {
		destroy(conn)
		return nil, false, ErrPooler
	}
	if !r.granted && c.mode == driver.SharedPermit {
		return nil, false, gateHeld{conn}
	}
	if !r.granted {
		destroy(conn)
		return nil, false, errors.New("postgres: acquire: blocking lock not granted")
	}
	return newHold(conn, c, r), false, nil
}

// newHold is the hold of a grant on conn.
func newHold(conn *pgxpool.Conn, c *call, r *acquireRow) *hold {
	pgc := conn.Conn().PgConn()
	return &hold{owner: c.owner, token: r.token, conn: conn, origIST: r.origIST, origApp: r.origApp,
		adv: c.adv, pid: pgc.PID(), server: pgc.Conn().RemoteAddr().String()}
}

// lostSession reports an error that means the session broke under the
// statement, with no server error: the connection was closed or reset, or
// the server went away.
func lostSession(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return sessionKilled(err)
	}
	var opErr *net.OpError
	return errors.As(err, &opErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err)
}

// sessionKilled reports a server error that ends the session from outside:
// pg_terminate_backend, a crash of another backend, a shutdown.
func sessionKilled(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "57P01", "57P02", "57P03": // admin_shutdown, crash_shutdown, cannot_connect_now
		return true
	}
	return false
}

// Refresh resets the TTL of the lock owner holds through this Locker: one
// statement on the pinned connection, which restarts the server's
// idle_session_timeout and sets it to ttl. A lock whose session has ended
// (expired, terminated, server restarted) is not revived: Refresh returns
// driver.ErrNotHeld. Locks are tied to the session that took them, so
// Refresh through any other Locker also returns driver.ErrNotHeld.
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrClosed or
// ctx.Err(). If ctx ends while the statement is in flight the connection is
// closed and the lock ends with it: the error then wraps both ctx.Err() and
// driver.ErrNotHeld.
func (l *advisoryLocker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return l.refreshShared(ctx, key, 0, owner, ttl)
}

// heldSlot returns key's slot, locked, when owner holds key through this
// Locker, and the function that unlocks it and gives it back; otherwise an
// error wrapping driver.ErrNotHeld that names op.
func (l *advisoryLocker) heldSlot(op string, id slotID, owner string) (*slot, func(), error) {
	key := id.key
	s := l.peekSlot(id)
	if s == nil {
		return nil, nil, notHeld(op, key)
	}
	s.mu.Lock()
	unlock := func() {
		s.mu.Unlock()
		l.putSlot(id, s)
	}
	if s.h == nil || s.h.owner != owner {
		unlock()
		return nil, nil, notHeld(op, key)
	}
	return s, unlock, nil
}

// refreshLocked runs the refresh statement on s.h; the caller holds s.mu.
// If the session is gone it drops the hold and returns an error wrapping
// driver.ErrNotHeld.
func (l *advisoryLocker) refreshLocked(ctx context.Context, s *slot, c *call) error {
	h := s.h
	ttl := strconv.FormatInt(c.ttlMS, 10)
	app := appName(h.token, c.ttlMS, ownerTag(h.owner))
	var err error
	if needTCP(h.conn, c.ttlMS) {
		if _, err = h.conn.Exec(ctx, l.sql.refreshTCP, ttl, app, keepaliveIdle(c.ttlMS)); err == nil {
			tcpRaised(h.conn, c.ttlMS)
		}
	} else {
		_, err = h.conn.Exec(ctx, l.sql.refresh, ttl, app)
	}
	if err == nil {
		return nil
	}
	if h.conn.Conn().IsClosed() {
		l.setHold(s, nil)
		destroy(h.conn)
		return fmt.Errorf("%w: session ended: %w", driver.ErrNotHeld, err)
	}
	return err
}

// Release frees the lock owner holds through this Locker (pg_advisory_unlock
// and the session's settings restored, in one statement) and returns the
// connection to the pool. If the lock's session has already ended it returns
// driver.ErrNotHeld, as it does for an owner that does not hold key here.
//
// Errors wrap driver.ErrInvalid, driver.ErrNotHeld, driver.ErrClosed or
// ctx.Err(). On any failure the connection is closed, so the server frees
// the lock anyway (at the latest after the TTL if it cannot be reached).
func (l *advisoryLocker) Release(ctx context.Context, key, owner string) error {
	if key == "" {
		return fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	if owner == "" {
		return fmt.Errorf("postgres: empty owner: %w", driver.ErrInvalid)
	}
	return l.releaseShared(ctx, key, 0, owner)
}

// releaseLocked runs sql, a release statement, on the connection of s.h
// and ends the hold; the caller holds s.mu. See Release.
func (l *advisoryLocker) releaseLocked(ctx context.Context, s *slot, key, sql string) error {
	h := s.h
	l.setHold(s, nil) // also ends the watch: our own unlock is no loss
	var unlocked bool
	var ist, app string
	err := h.conn.QueryRow(ctx, sql, h.adv, h.origIST, h.origApp).Scan(&unlocked, &ist, &app)
	if err == nil && unlocked {
		h.conn.Release()
		return nil
	}
	closed := h.conn.Conn().IsClosed()
	destroy(h.conn)
	if err == nil {
		return fmt.Errorf("postgres: release %q: session did not hold the lock: %w", key, driver.ErrNotHeld)
	}
	if closed && ctx.Err() == nil {
		return fmt.Errorf("postgres: release %q: %w: session ended: %w", key, driver.ErrNotHeld, err)
	}
	return l.fail(ctx, "release", err)
}

// failHeld is fail for an operation on a held lock: if ctx ended and the
// connection was closed, the lock is gone too.
func (l *advisoryLocker) failHeld(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil && errors.Is(err, driver.ErrNotHeld) {
		return fmt.Errorf("%w (%w)", l.fail(ctx, op, err), driver.ErrNotHeld)
	}
	return l.fail(ctx, op, err)
}

func notHeld(op, key string) error {
	return fmt.Errorf("postgres: %s %q: %w", op, key, driver.ErrNotHeld)
}

// sqlError turns server errors that mean a misconfiguration into this
// package's errors.
func sqlError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "25006" { // read_only_sql_transaction
		return fmt.Errorf("%w: %w", ErrStandby, err)
	}
	return err
}

// destroy closes a pooled connection and hands it back, so that the pool
// discards it: its session, and any lock it holds, ends.
func destroy(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Conn().Close(ctx)
	conn.Release()
}
