package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Lease-mode renewals. Refresh calls that fall due together are sent as one
// statement (leaseRefreshBatchSQL, up to maxRenewBatch locks), on a
// connection of their own outside the pool: renewals of held locks never
// wait behind acquires for a pooled connection, and with thousands of locks
// held a renewal costs a fraction of a round trip. There is no artificial
// delay: while one statement is in flight the next batch gathers. Results
// stay per lock: the statement returns the locks it renewed, and each
// Refresh gets its own answer (renewed, or ErrNotHeld); an error of the
// statement itself is reported to the Refreshes of that batch only, as a
// failed round trip would be. If the reserved connection cannot be opened
// (the server has no free slot), the batch runs on a pooled connection and
// the reserved one is tried again after renewConnRetry.

// maxRenewBatch is the most locks one renewal statement names.
const maxRenewBatch = 1000

// renewStatementTimeout bounds a renewal statement whose Refreshes have no
// deadline.
const renewStatementTimeout = 10 * time.Second

// renewConnRetry is how long after a failed attempt to open the reserved
// connection the next attempt is made (meanwhile batches use the pool).
const renewConnRetry = time.Second

// leaseRefreshBatchSQL renews every row named by the arrays $1 ids, $2
// owners, $3 TTLs in ms, each owner-checked and never an expired row, as
// leaseRefreshSQL does for one; it returns the 1-based positions renewed.
// A batch never names one id twice.
const leaseRefreshBatchSQL = `
UPDATE TABLE AS l SET expires_at = clock_timestamp() + r.ms * interval '1 millisecond', ttl_ms = r.ms
FROM unnest($1::bytea[], $2::bytea[], $3::bigint[]) WITH ORDINALITY AS r(id, owner, ms, n)
WHERE l.id = r.id AND l.owner = r.owner AND l.expires_at > clock_timestamp() AND DURABLE = ''
RETURNING r.n`

// errBatchNotHeld answers a Refresh whose row the batch did not renew.
var errBatchNotHeld = errors.New("not renewed")

type renewReq struct {
	ctx   context.Context
	id    []byte
	owner []byte
	ms    int64
	done  chan error // buffered; nil, errBatchNotHeld or the statement's error
}

type leaseRenewer struct {
	mu      sync.Mutex
	queue   []*renewReq
	running bool

	// Used only by the running batch loop (and Close, after it ends).
	conn     *pgx.Conn
	connFail time.Time // last failed attempt to open conn
}

// renew queues one renewal and waits for its answer or ctx.
func (l *leaseLocker) renew(ctx context.Context, id, owner []byte, ms int64) error {
	req := &renewReq{ctx: ctx, id: id, owner: owner, ms: ms, done: make(chan error, 1)}
	r := &l.ren
	r.mu.Lock()
	r.queue = append(r.queue, req)
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start {
		l.bg.Add(1)
		go l.renewLoop()
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// renewLoop sends batches until the queue is empty.
func (l *leaseLocker) renewLoop() {
	defer l.bg.Done()
	for {
		batch := l.ren.next()
		if batch == nil {
			return
		}
		l.renewBatch(batch)
	}
}

// next takes the next batch off the queue: live requests, at most
// maxRenewBatch, no id twice (a repeated id waits for the next batch).
// It returns nil, and marks the loop stopped, when the queue is empty.
func (r *leaseRenewer) next() []*renewReq {
	r.mu.Lock()
	defer r.mu.Unlock()
	var batch, rest []*renewReq
	seen := make(map[string]bool)
	for _, q := range r.queue {
		switch {
		case q.ctx.Err() != nil:
			q.done <- q.ctx.Err()
		case len(batch) < maxRenewBatch && !seen[string(q.id)]:
			seen[string(q.id)] = true
			batch = append(batch, q)
		default:
			rest = append(rest, q)
		}
	}
	r.queue = rest
	if len(batch) == 0 {
		r.running = false
	}
	return batch
}

// renewBatch runs one renewal statement for batch and answers each request,
// retrying on a fresh connection when the session broke.
func (l *leaseLocker) renewBatch(batch []*renewReq) {
	ctx, cancel := batchContext(l.ctx, batch)
	defer cancel()
	ids := make([][]byte, len(batch))
	owners := make([][]byte, len(batch))
	mss := make([]int64, len(batch))
	for i, q := range batch {
		ids[i], owners[i], mss[i] = q.id, q.owner, q.ms
	}
	var renewed []int64
	var err error
	for tries := 0; ; tries++ {
		renewed, err = l.renewOnce(ctx, ids, owners, mss)
		if err == nil || !retryable(err) || ctx.Err() != nil || tries >= l.retries {
			break
		}
	}
	ok := make([]bool, len(batch))
	for _, n := range renewed {
		if n >= 1 && int(n) <= len(batch) {
			ok[n-1] = true
		}
	}
	for i, q := range batch {
		switch {
		case err != nil:
			q.done <- err
		case ok[i]:
			q.done <- nil
		default:
			q.done <- errBatchNotHeld
		}
	}
}

// batchContext bounds a batch's statement by the latest deadline of its
// requests (renewStatementTimeout if one has none), and by Close.
func batchContext(base context.Context, batch []*renewReq) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, q := range batch {
		d, ok := q.ctx.Deadline()
		if !ok {
			return context.WithTimeout(base, renewStatementTimeout)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

// renewOnce sends the statement once, on the reserved connection (opened
// if needed) or, when it cannot be opened, on a pooled one.
func (l *leaseLocker) renewOnce(ctx context.Context, ids, owners [][]byte, mss []int64) ([]int64, error) {
	r := &l.ren
	if r.conn == nil && time.Since(r.connFail) >= renewConnRetry {
		c, err := pgx.ConnectConfig(ctx, l.pool.Config().ConnConfig)
		if err != nil {
			r.connFail = time.Now()
		} else {
			r.conn = c
		}
	}
	args := l.args(ids, owners, mss)
	var rows pgx.Rows
	var err error
	if r.conn != nil {
		rows, err = r.conn.Query(ctx, l.sql.refreshBatch, args...)
	} else {
		rows, err = l.pool.Query(ctx, l.sql.refreshBatch, args...)
	}
	if err == nil {
		var renewed []int64
		renewed, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err == nil {
			return renewed, nil
		}
	}
	if r.conn != nil && (r.conn.IsClosed() || lostSession(err) || ctx.Err() != nil) {
		l.closeRenewConn()
	}
	return nil, err
}

// closeRenewConn closes the reserved connection; the next batch opens a new
// one.
func (l *leaseLocker) closeRenewConn() {
	if c := l.ren.conn; c != nil {
		l.ren.conn = nil
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Close(ctx)
		cancel()
	}
}
