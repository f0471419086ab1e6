package postgres

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of the URL parameters and options.
const (
	// DefaultSchema is the schema of the token sequence and the lease
	// table.
	DefaultSchema = "public"
	// DefaultNamespace is hashed with every key (see AdvisoryKey).
	DefaultNamespace = "locker"
	// OpenTimeout bounds the connection and setup Driver.Open does.
	OpenTimeout = 30 * time.Second
	// SequenceName is the name of the fencing token sequence in the schema.
	SequenceName = "locker_token_seq"
)

// MaxTTL is the longest TTL: idle_session_timeout is a 32-bit number of
// milliseconds.
const MaxTTL = time.Duration(math.MaxInt32) * time.Millisecond

// Errors of this driver, besides the sentinels of package driver.
var (
	// ErrStandby is returned by Open and New, and by Acquire, when the
	// server is a read-only standby: advisory locks taken there do not
	// coordinate with the primary.
	ErrStandby = errors.New("postgres: server is a read-only standby (in recovery); advisory locks there do not coordinate with the primary: connect to the primary (target_session_attrs=read-write)")
	// ErrPooler is returned when the connection goes through a pooler such
	// as PgBouncer: the backend process id the server reports differs from
	// the one in the connection handshake. Session-level advisory locks and
	// settings cannot be pinned through a pooler, so the driver refuses.
	ErrPooler = errors.New("postgres: connection goes through a pooler (PgBouncer?): session-level locks need a direct connection to PostgreSQL")
	// ErrServerVersion is returned for servers older than PostgreSQL 14,
	// which lack idle_session_timeout.
	ErrServerVersion = errors.New("postgres: PostgreSQL 14 or later is required (idle_session_timeout)")
)

func init() {
	locker.Register("postgres", Driver{})
	locker.Register("postgresql", Driver{})
}

// Driver is the driver.Driver registered as "postgres" and "postgresql".
type Driver struct{}

// Open calls the package-level Open with a background context bounded by
// OpenTimeout.
func (Driver) Open(dsn string) (driver.Locker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), OpenTimeout)
	defer cancel()
	l, err := Open(ctx, dsn)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// advisoryLocker is a Locker in advisory mode: each lock is a session-level
// advisory lock on a pooled connection pinned to it.
type advisoryLocker struct {
	pool    *pgxpool.Pool
	ownPool bool
	ns      string
	sql     statements
	shsql   sharedStatements

	ctx    context.Context // done once Close begins
	cancel context.CancelFunc

	mu        sync.Mutex
	closed    bool
	ops       sync.WaitGroup
	slots     map[slotID]*slot
	watcher   *sessionWatcher    // started by the first WatchHold
	prober    *sessionProber     // started by the first WatchHold
	listeners uint64             // last WatchHold listener id
	goneFn    func(*hold, error) // sessionGone, bound once for the watcher
	pwake     chan struct{}      // closed (and replaced) when a permit is released here
}

// slotID names a slot: a mutex's key (kind 0), or a shared hold's kind
// ('s' permit, 'r' read-write lock), key and owner.
type slotID struct {
	kind       byte
	key, owner string
}

// mutexID is the slotID of the mutex on key.
func mutexID(key string) slotID { return slotID{key: key} }

// slot is the per-key state of a Locker.
type slot struct {
	refs int   // guarded by Locker.mu
	held bool  // guarded by Locker.mu: h != nil
	cur  *hold // guarded by Locker.mu: h, for WatchHold

	mu sync.Mutex // guards h and serializes use of h.conn
	h  *hold
}

// openAdvisory opens an advisory-mode Locker on a pool of its own.
func openAdvisory(ctx context.Context, c *config) (*advisoryLocker, error) {
	pool, err := newPool(ctx, c)
	if err != nil {
		return nil, err
	}
	l, err := newAdvisory(ctx, pool, c)
	if err != nil {
		pool.Close()
		return nil, err
	}
	l.ownPool = true
	return l, nil
}

// newPool opens the pool c describes; a failure wraps driver.ErrUnavailable
// where the server could not be reached.
func newPool(ctx context.Context, c *config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, c.pool)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", withMode(unavailable(err), c.mode, c.pool.MaxConns))
	}
	return pool, nil
}

func newAdvisory(ctx context.Context, pool *pgxpool.Pool, c *config) (*advisoryLocker, error) {
	r, err := setup(ctx, pool, c.schema, false)
	if err != nil {
		return nil, withMode(err, ModeAdvisory, pool.Config().MaxConns)
	}
	l := &advisoryLocker{pool: pool, ns: c.namespace, sql: buildStatements(r.seq), shsql: buildSharedStatements(r.seq), slots: map[slotID]*slot{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	return l, nil
}

// Capabilities reports a 10ms minimum TTL kept to the millisecond (the unit
// of idle_session_timeout), durable tokens (a WAL-logged sequence, made
// durable before a grant is reported), and LockerBound: an advisory lock
// belongs to the session, so only the Locker that took it can refresh or
// release it.
func (l *advisoryLocker) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: 10 * time.Millisecond, TTLGranularity: time.Millisecond, DurableTokens: true, LockerBound: true, MaxOwner: maxOwnerTag, OwnerASCII: true}
}

// Ping makes one round trip to the server on a pooled connection. It returns
// driver.ErrClosed after Close.
func (l *advisoryLocker) Ping(ctx context.Context) error {
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

// Close aborts calls in progress (each leaves nothing held or queued on the
// server, see AcquireWait) and waits for them, then ends every held lock:
// it unlocks it on its pinned connection, all locks at once, and closes
// the connection (nothing goes back to the pool holding a lock; a lock
// whose unlock fails or takes over 1s ends with its session, once the
// server notices the closed connection). Then it closes the pool if Open
// created it. It is idempotent; later calls of every method return
// driver.ErrClosed.
func (l *advisoryLocker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	l.ops.Wait()
	l.mu.Lock()
	slots := l.slots
	l.slots = map[slotID]*slot{}
	l.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range slots {
		s.mu.Lock()
		if h := s.h; h != nil {
			l.setHold(s, nil)
			wg.Go(func() { letGo(h.conn) })
		}
		s.mu.Unlock()
	}
	wg.Wait()
	l.mu.Lock()
	w, p := l.watcher, l.prober
	l.watcher, l.prober = nil, nil
	l.mu.Unlock()
	if p != nil {
		p.close()
	}
	if w != nil {
		w.close()
	}
	if l.ownPool {
		l.pool.Close()
	}
	return nil
}

// begin starts an operation: it fails once Close has begun, and returns a
// context that is also cancelled (with cause driver.ErrClosed) by Close.
func (l *advisoryLocker) begin(ctx context.Context) (context.Context, func(), error) {
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
func (l *advisoryLocker) fail(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		if cause := context.Cause(ctx); errors.Is(cause, driver.ErrClosed) {
			return fmt.Errorf("postgres: %s: %w", op, driver.ErrClosed)
		} else {
			return fmt.Errorf("postgres: %s: %w", op, cause)
		}
	}
	return fmt.Errorf("postgres: %s: %w", op, withMode(err, ModeAdvisory, l.pool.Config().MaxConns))
}

// getSlot returns key's slot, creating it, and counts a reference.
func (l *advisoryLocker) getSlot(key slotID) *slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.slots[key]
	if s == nil {
		s = &slot{}
		l.slots[key] = s
	}
	s.refs++
	return s
}

// peekSlot returns key's slot with a reference, or nil.
func (l *advisoryLocker) peekSlot(key slotID) *slot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.slots[key]
	if s != nil {
		s.refs++
	}
	return s
}

// putSlot drops a reference; the slot is forgotten once unreferenced and
// empty.
func (l *advisoryLocker) putSlot(key slotID, s *slot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.refs--
	if s.refs == 0 && !s.held && l.slots[key] == s {
		delete(l.slots, key)
	}
}

// setHold sets s.h; the caller holds s.mu. A hold it replaces stops being
// watched, without a report. (Lock order: slot.mu before Locker.mu, never
// the reverse.)
func (l *advisoryLocker) setHold(s *slot, h *hold) {
	s.h = h
	l.mu.Lock()
	if old := s.cur; old != nil && old != h {
		old.unwatchLocked()
	}
	s.cur = h
	s.held = h != nil
	l.mu.Unlock()
}
