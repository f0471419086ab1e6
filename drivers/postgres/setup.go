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

// setupResult is what setup found and made.
type setupResult struct {
	seq    string // the sequence, quoted and schema-qualified
	table  string // lease mode: the lease table, quoted and schema-qualified
	shared string // lease mode: the shared table, quoted and schema-qualified
	pooler bool   // lease mode: the connection goes through a pooler
}

// setup checks the server and creates the token sequence if it is missing,
// and in lease mode the lease table too. Advisory mode refuses a pooler;
// lease mode notes it, and runs its statements without named prepared
// statements, which a transaction-mode pooler cannot keep.
func setup(ctx context.Context, pool *pgxpool.Pool, schema string, lease bool) (setupResult, error) {
	st := &setupCall{schema: schema, lease: lease}
	st.res.seq = pgx.Identifier{schema, SequenceName}.Sanitize()
	if lease {
		st.res.table = pgx.Identifier{schema, LeaseTableName}.Sanitize()
		st.res.shared = pgx.Identifier{schema, SharedTableName}.Sanitize()
		st.mode = []any{pgx.QueryExecModeExec}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return st.res, fmt.Errorf("postgres: %w", unavailable(err))
	}
	ok := false
	defer func() {
		if ok {
			conn.Release()
		} else {
			destroy(conn)
		}
	}()
	if err := st.checkServer(ctx, conn); err != nil {
		return st.res, err
	}
	if err := st.create(ctx, conn, pool.Config().ConnConfig.User); err != nil {
		return st.res, err
	}
	if err := st.checkSequence(ctx, conn); err != nil {
		return st.res, err
	}
	if lease {
		if err := checkLeaseTable(ctx, conn, st.res.table, st.mode); err != nil {
			return st.res, err
		}
	}
	ok = true
	return st.res, nil
}

// setupCall is one setup: what it was asked and what it found.
type setupCall struct {
	schema string
	lease  bool
	mode   []any // the query mode, prepended to every statement's arguments
	res    setupResult
}

// args prepends the query mode to a statement's arguments.
func (st *setupCall) args(a ...any) []any { return append(append([]any{}, st.mode...), a...) }

// checkServer refuses a standby, a server older than 14 and, in advisory
// mode, a pooler (noted in res.pooler).
func (st *setupCall) checkServer(ctx context.Context, conn *pgxpool.Conn) error {
	var (
		standby bool
		pid     uint32
		version int
	)
	err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), pg_backend_pid(), current_setting('server_version_num')::int`, st.mode...).
		Scan(&standby, &pid, &version)
	if err != nil {
		return fmt.Errorf("postgres: checking the server: %w", unavailable(err))
	}
	st.res.pooler = pid != conn.Conn().PgConn().PID()
	switch {
	case standby:
		return ErrStandby
	case st.res.pooler && !st.lease:
		return ErrPooler
	case version < 140000:
		return fmt.Errorf("%w (server is %d)", ErrServerVersion, version)
	}
	return nil
}

// create makes the schema, the sequence and in lease mode the table if
// missing, serialized across processes by a transaction-scoped advisory
// lock (CREATE ... IF NOT EXISTS races with itself). Existence is checked
// first so that a role without CREATE privilege can use objects an
// administrator made; such a role, role, is told the DDL to run.
func (st *setupCall) create(ctx context.Context, conn *pgxpool.Conn, role string) error {
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, st.args(AdvisoryKey("locker-setup", setupKeyName))...); err != nil {
			return err
		}
		var seqExists, tableExists, sharedExists bool
		if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, $2::text <> '' AND to_regclass($2) IS NOT NULL,
			$3::text <> '' AND to_regclass($3) IS NOT NULL AND to_regproc($4) IS NOT NULL`,
			st.args(st.res.seq, st.res.table, st.res.shared, sharedFuncNames(st.schema)[1])...).Scan(&seqExists, &tableExists, &sharedExists); err != nil {
			return err
		}
		if seqExists && (!st.lease || tableExists && sharedExists) {
			return nil
		}
		if err := st.createMissing(ctx, tx, seqExists, tableExists); err != nil {
			return err
		}
		if st.lease && !sharedExists {
			return st.createShared(ctx, tx)
		}
		return nil
	})
	if err == nil {
		return nil
	}
	what := "sequence " + st.res.seq
	if st.lease {
		what += ", lease table " + st.res.table + " and shared table " + st.res.shared
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("postgres: creating %s: %w; as a role with CREATE on the database, run: %s",
			what, err, setupDDL(st.schema, st.res.seq, st.res.table, role))
	}
	return fmt.Errorf("postgres: creating %s: %w", what, unavailable(err))
}

// createMissing creates, in tx, the schema if missing and the sequence and
// table that do not exist.
func (st *setupCall) createMissing(ctx context.Context, tx pgx.Tx, seqExists, tableExists bool) error {
	var schemaExists bool
	if err := tx.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL`, st.args(pgx.Identifier{st.schema}.Sanitize())...).Scan(&schemaExists); err != nil {
		return err
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{st.schema}.Sanitize(), st.mode...); err != nil {
			return err
		}
	}
	if !seqExists {
		if _, err := tx.Exec(ctx, sequenceDDL(st.res.seq), st.mode...); err != nil {
			return err
		}
	}
	if st.lease && !tableExists {
		if _, err := tx.Exec(ctx, leaseTableDDL(st.res.table), st.mode...); err != nil {
			return err
		}
	}
	return nil
}

// createShared creates, in tx, the shared table and its functions (also in
// a schema made by an earlier version, which lacks them).
func (st *setupCall) createShared(ctx context.Context, tx pgx.Tx) error {
	for _, ddl := range append([]string{sharedTableDDL(st.res.shared), sharedTableUpgrade(st.res.shared)}, sharedFuncs(st.schema, st.res.shared, st.res.seq)...) {
		if _, err := tx.Exec(ctx, ddl, st.mode...); err != nil {
			return err
		}
	}
	return nil
}

// checkSequence checks what fencing relies on, since the sequence may
// predate us or have been altered: CACHE 1, a positive increment, no
// cycle, and our USAGE privilege.
func (st *setupCall) checkSequence(ctx context.Context, conn *pgxpool.Conn) error {
	seq := st.res.seq
	var cache, increment int64
	var cycle, usable bool
	err := conn.QueryRow(ctx, `SELECT s.seqcache, s.seqincrement, s.seqcycle, has_sequence_privilege(s.seqrelid, 'USAGE')
		FROM pg_sequence s WHERE s.seqrelid = $1::regclass`, st.args(seq)...).Scan(&cache, &increment, &cycle, &usable)
	if err != nil {
		return fmt.Errorf("postgres: checking sequence %s: %w", seq, unavailable(err))
	}
	if cache != 1 || increment <= 0 || cycle {
		return fmt.Errorf("postgres: sequence %s has CACHE %d, INCREMENT %d, CYCLE %v: fencing tokens need CACHE 1, a positive INCREMENT and NO CYCLE", seq, cache, increment, cycle)
	}
	if !usable {
		return fmt.Errorf("postgres: no USAGE privilege on sequence %s", seq)
	}
	return nil
}

// sequenceDDL creates the token sequence. CACHE 1 is essential: with a
// cache each session hands out its own block of values and tokens stop
// increasing across sessions.
func sequenceDDL(seq string) string {
	return `CREATE SEQUENCE IF NOT EXISTS ` + seq + ` AS bigint MINVALUE 1 START 1 INCREMENT 1 CACHE 1 NO CYCLE`
}

// setupDDL is what an administrator runs for a role that may not create
// the driver's objects itself: create them, and grant the role their use.
func setupDDL(schema, seq, table, role string) string {
	sch := pgx.Identifier{schema}.Sanitize()
	r := pgx.Identifier{role}.Sanitize()
	s := `CREATE SCHEMA IF NOT EXISTS ` + sch + `; ` + sequenceDDL(seq) + `;`
	shared := pgx.Identifier{schema, SharedTableName}.Sanitize()
	if table != "" {
		s += ` ` + leaseTableDDL(table) + `; ` + sharedTableDDL(shared) + `; ` + sharedTableUpgrade(shared) + `;`
		for _, f := range sharedFuncs(schema, shared, seq) {
			s += ` ` + f + `;`
		}
	}
	s += ` GRANT USAGE ON SCHEMA ` + sch + ` TO ` + r + `; GRANT USAGE ON SEQUENCE ` + seq + ` TO ` + r + `;`
	if table != "" {
		for _, t := range []string{table, shared} {
			s += ` GRANT SELECT, INSERT, UPDATE, DELETE ON ` + t + ` TO ` + r + `;`
		}
	}
	return s
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
		return fmt.Errorf("%w: %w", driver.ErrUnavailable, &SlotsError{Err: err})
	}
	return fmt.Errorf("%w: connect: %w", driver.ErrUnavailable, err)
}
