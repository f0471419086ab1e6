package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// setupKeyName is hashed (in the namespace "locker-setup") into the advisory
// key that serializes concurrent setups.
const setupKeyName = "setup"

// setup checks the server and creates the token sequence if it is missing.
// It returns the sequence's name as a quoted, schema-qualified identifier.
func setup(ctx context.Context, pool *pgxpool.Pool, schema, namespace string) (string, error) {
	seq := pgx.Identifier{schema, SequenceName}.Sanitize()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return "", fmt.Errorf("postgres: %w", connectError(err))
	}
	ok := false
	defer func() {
		if ok {
			conn.Release()
		} else {
			destroy(conn)
		}
	}()
	var (
		standby bool
		pid     uint32
		version int
	)
	err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), pg_backend_pid(), current_setting('server_version_num')::int`).
		Scan(&standby, &pid, &version)
	if err != nil {
		return "", fmt.Errorf("postgres: checking the server: %w", err)
	}
	switch {
	case standby:
		return "", ErrStandby
	case pid != conn.Conn().PgConn().PID():
		return "", ErrPooler
	case version < 140000:
		return "", fmt.Errorf("%w (server is %d)", ErrServerVersion, version)
	}

	// Create the schema and the sequence if missing, serialized across
	// processes by a transaction-scoped advisory lock (CREATE ... IF NOT
	// EXISTS races with itself). Existence is checked first so that a role
	// without CREATE privilege can use objects an administrator made.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, AdvisoryKey("locker-setup", setupKeyName)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, seq).Scan(&exists); err != nil {
			return err
		}
		if exists {
			return nil
		}
		var schemaExists bool
		if err := tx.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, pgx.Identifier{schema}.Sanitize()).Scan(&schemaExists); err != nil {
			return err
		}
		if !schemaExists {
			if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{schema}.Sanitize()); err != nil {
				return err
			}
		}
		// CACHE 1 is essential: with a cache each session hands out its own
		// block of values and tokens stop increasing across sessions.
		_, err := tx.Exec(ctx, `CREATE SEQUENCE IF NOT EXISTS `+seq+` AS bigint MINVALUE 1 START 1 INCREMENT 1 CACHE 1 NO CYCLE`)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("postgres: creating sequence %s: %w", seq, err)
	}

	// The sequence may predate us or have been altered: check what fencing
	// relies on.
	var cache, increment int64
	var cycle, usable bool
	err = conn.QueryRow(ctx, `SELECT s.seqcache, s.seqincrement, s.seqcycle, has_sequence_privilege(s.seqrelid, 'USAGE')
		FROM pg_sequence s WHERE s.seqrelid = $1::regclass`, seq).Scan(&cache, &increment, &cycle, &usable)
	if err != nil {
		return "", fmt.Errorf("postgres: checking sequence %s: %w", seq, err)
	}
	if cache != 1 || increment <= 0 || cycle {
		return "", fmt.Errorf("postgres: sequence %s has CACHE %d, INCREMENT %d, CYCLE %v: fencing tokens need CACHE 1, a positive INCREMENT and NO CYCLE", seq, cache, increment, cycle)
	}
	if !usable {
		return "", fmt.Errorf("postgres: no USAGE privilege on sequence %s", seq)
	}
	ok = true
	return seq, nil
}

// connectError makes connection failures readable: pgx's messages already
// name the host and the server's reason (password authentication failed,
// database does not exist, too many clients).
func connectError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "53300" {
		return fmt.Errorf("server has no free connection slots (max_connections; every held lock takes one): %w", err)
	}
	return fmt.Errorf("connect: %w", err)
}

// statements are the SQL texts of a Locker, built once for its sequence.
type statements struct {
	try, wait, refresh, release, inspect string
}

// The acquire statement, in order (each OFFSET 0 subquery is evaluated
// before the level above it):
//  1. read the session's idle_session_timeout and application_name, to
//     restore them on release;
//  2. take the session-level advisory lock, only if the backend is the one
//     we connected to (a pooler in between would hand our session lock to
//     other clients);
//  3. if granted, draw the fencing token from the sequence, inside the lock;
//     the statement runs in its own implicit transaction, whose commit makes
//     the sequence's WAL record durable before the reply (forcing
//     synchronous_commit to at least "local" if it is off);
//  4. if granted, arm idle_session_timeout = TTL (the server ends the session
//     and so frees the lock after TTL without a statement) and publish the
//     holder in application_name;
//  5. if not granted, look up the holder (pg_locks joined with
//     pg_stat_activity) to report its remaining TTL.
//
// Parameters: $1 advisory key, $2 expected backend pid, $3 TTL in ms (text),
// $4 TTL in ms (hex), $5 owner tag, $6 and $7 the key's high and low halves
// as they show in pg_locks.
const acquireTemplate = `
SELECT t.ok, t.tok, t.ist, t.app,
	CASE WHEN t.ok THEN set_config('idle_session_timeout', $3, false) END,
	CASE WHEN t.ok THEN set_config('application_name', 'lk/' || to_hex(t.tok) || '/' || $4 || '/' || $5, false) END,
	CASE WHEN t.ok AND current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) END,
	h.application_name, h.state, h.idle_ms
FROM (
	SELECT s.ok, s.ist, s.app, CASE WHEN s.ok THEN nextval(SEQ::regclass) END AS tok
	FROM (
		SELECT current_setting('idle_session_timeout') AS ist,
			current_setting('application_name') AS app,
			CASE WHEN pg_backend_pid() = $2 THEN LOCKFN($1) END AS ok
		OFFSET 0
	) s
	OFFSET 0
) t
LEFT JOIN LATERAL (
	SELECT a.application_name, a.state,
		(extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint AS idle_ms
	FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE NOT t.ok AND l.locktype = 'advisory' AND l.granted
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND l.classid = $6 AND l.objid = $7 AND l.objsubid = 1
	LIMIT 1
) h ON true`

func buildStatements(seq string) statements {
	lit := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
	acq := strings.ReplaceAll(acquireTemplate, "SEQ", lit)
	return statements{
		try: strings.ReplaceAll(acq, "LOCKFN", "pg_try_advisory_lock"),
		// pg_advisory_lock returns void, whose text form is ''.
		wait:    strings.ReplaceAll(acq, "LOCKFN($1)", "(pg_advisory_lock($1)::text = '')"),
		refresh: `SELECT set_config('idle_session_timeout', $1, false), set_config('application_name', $2, false)`,
		release: `SELECT pg_advisory_unlock($1), set_config('idle_session_timeout', $2, false), set_config('application_name', $3, false)`,
		inspect: `
SELECT a.application_name, a.state, (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
LIMIT 1`,
	}
}
