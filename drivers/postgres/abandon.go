package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// abandonTimeout bounds how long an acquire that its context cut short
// spends making sure its session neither holds nor waits for the key.
const abandonTimeout = time.Second

// unlockAllSQL frees every session-level advisory lock of the session it
// runs on: a pooled connection whose acquire was cut short holds at most
// that one lock.
const unlockAllSQL = `SELECT pg_advisory_unlock_all()`

// terminateSQL ends the backend $1 if it holds or waits for the advisory
// key ($2, $3: its halves as in pg_locks) in this database, waiting up to
// $4 ms for it to exit, and counts those still there. The OFFSET 0
// subquery picks the rows before any is terminated.
const terminateSQL = `
SELECT count(*) FROM (
	SELECT l.pid FROM pg_locks l
	WHERE l.locktype = 'advisory' AND l.pid = $1 AND l.pid <> pg_backend_pid()
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = $2 AND l.objid = $3 AND l.objsubid = 1
	OFFSET 0
) l
WHERE NOT pg_terminate_backend(l.pid, $4)`

// runGuarded runs the acquire statement on conn without letting ctx close
// the connection under it: pgx's own reaction to cancellation closes the
// socket, which leaves the backend queued in the lock manager (and later
// holding the lock) until the server notices. When ctx ends first, a
// cancel request goes to the server, and only if the statement has not
// ended within cancelGrace is the connection closed. cut reports that ctx
// ended before the statement did: the caller must then abandon conn,
// whatever r and err say.
func (l *advisoryLocker) runGuarded(ctx context.Context, conn *pgxpool.Conn, wait bool, c *call) (r *acquireRow, cut bool, err error) {
	qctx, qcancel := context.WithCancel(context.WithoutCancel(ctx))
	defer qcancel()
	pgc := conn.Conn().PgConn()
	cancelDone := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(cancelDone)
		force := time.AfterFunc(cancelGrace, qcancel)
		defer force.Stop()
		cctx, ccancel := context.WithTimeout(context.Background(), cancelGrace)
		defer ccancel()
		_ = pgc.CancelRequest(cctx)
		// Do not reuse the connection before the statement has ended.
		<-qctx.Done()
	})
	r, err = l.run(qctx, conn, wait, c)
	qcancel() // lets the AfterFunc return
	if !stop() {
		<-cancelDone
		return r, true, err
	}
	return r, false, err
}

// abandon disposes of conn, whose acquire statement for adv was cut short,
// so that once it returns its session neither waits for nor holds the
// lock, whether or not the statement was granted it: on a live connection
// it frees the session's advisory locks (a statement that runs means the
// acquire has ended); otherwise, or if that fails, it terminates the
// backend from another connection, if it still holds or waits for adv, and
// waits for it to exit. Then the connection is closed. Both steps are
// bounded by abandonTimeout; past it the server ends the session on its
// own once it notices the closed connection.
func (l *advisoryLocker) abandon(conn *pgxpool.Conn, adv int64) {
	ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
	defer cancel()
	pgc := conn.Conn().PgConn()
	pid := pgc.PID()
	if !pgc.IsClosed() {
		if _, err := conn.Exec(ctx, unlockAllSQL); err == nil {
			destroy(conn)
			return
		}
	}
	destroy(conn)
	other, err := l.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer other.Release()
	for ctx.Err() == nil {
		var left int64
		err := other.QueryRow(ctx, terminateSQL, int32(pid), uint32(uint64(adv)>>32), uint32(uint64(adv)), int64(250)).Scan(&left)
		if err != nil || left == 0 {
			return
		}
	}
}

// letGo frees the advisory locks of conn's session, if it is still live,
// within abandonTimeout, and closes conn: once it returns, the session
// holds nothing unless the unlock failed.
func letGo(conn *pgxpool.Conn) {
	if !conn.Conn().IsClosed() {
		ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
		_, _ = conn.Exec(ctx, unlockAllSQL)
		cancel()
	}
	destroy(conn)
}
