package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-locker/locker/driver"
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
		return "", fmt.Errorf("postgres: %w", unavailable(err))
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

// unavailable marks a failure to connect as driver.ErrUnavailable: refused,
// unreachable or timed out, TLS or authentication failure, no free
// connection slot, a server starting up or shutting down; so is a pooled
// connection found broken (the server went away). pgx's messages already
// name the host and the server's reason. Other errors are returned as they
// are.
func unavailable(err error) error {
	var ce *pgconn.ConnectError
	if err == nil {
		return nil
	}
	if !errors.As(err, &ce) {
		if lostSession(err) && !sessionKilled(err) {
			return fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
		}
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "53300" {
		return fmt.Errorf("%w: server has no free connection slots (max_connections; every held lock takes one): %w", driver.ErrUnavailable, err)
	}
	return fmt.Errorf("%w: connect: %w", driver.ErrUnavailable, err)
}
