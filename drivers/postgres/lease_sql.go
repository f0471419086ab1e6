package postgres

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LeaseTableName is the name of the lease table in the schema (lease mode).
const LeaseTableName = "locker_leases"

// leaseChannel is the NOTIFY channel a release is announced on, and
// leaseGrantChannel the one a grant is; the payload is the key's id in hex.
const (
	leaseChannel      = "locker_lease"
	leaseGrantChannel = "locker_lease_grant"
)

// leaseTableDDL creates the lease table. id is the key's hash (see leaseID),
// the primary key and the only index: every update changes only columns no
// index covers, so it can be HOT, and the fillfactor leaves room on each
// page for the new row versions.
func leaseTableDDL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
	id bytea PRIMARY KEY,
	key bytea NOT NULL,
	owner bytea NOT NULL,
	token bigint NOT NULL,
	expires_at timestamptz NOT NULL,
	ttl_ms bigint NOT NULL
) WITH (fillfactor = 70)`
}

// leaseColumns is the shape the statements need: name and format_type.
var leaseColumns = []string{
	"expires_at timestamp with time zone",
	"id bytea",
	"key bytea",
	"owner bytea",
	"token bigint",
	"ttl_ms bigint",
}

// checkLeaseTable checks that an existing lease table has the shape the
// statements need (the columns, and id as its primary key) and that the
// role may use it.
func checkLeaseTable(ctx context.Context, conn *pgxpool.Conn, table string, mode []any) error {
	args := append(append([]any{}, mode...), table)
	var cols, pk []string
	var usable bool
	err := conn.QueryRow(ctx, `
SELECT coalesce((SELECT array_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attname)
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
	coalesce((SELECT array_agg(a.attname::text) FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = $1::regclass AND i.indisprimary), '{}'),
	has_table_privilege($1, 'SELECT') AND has_table_privilege($1, 'INSERT')
		AND has_table_privilege($1, 'UPDATE') AND has_table_privilege($1, 'DELETE')`, args...).Scan(&cols, &pk, &usable)
	if err != nil {
		return fmt.Errorf("postgres: checking lease table %s: %w", table, unavailable(err))
	}
	if !slices.Equal(cols, leaseColumns) || !slices.Equal(pk, []string{"id"}) {
		return fmt.Errorf("postgres: lease table %s has the wrong shape (columns %s; primary key %s): "+
			"drop or rename it and let Open create it, or create it as: %s",
			table, strings.Join(cols, ", "), strings.Join(pk, ", "), leaseTableDDL(table))
	}
	if !usable {
		return fmt.Errorf("postgres: lease table %s: this role lacks SELECT, INSERT, UPDATE, DELETE on it: run GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO <role>", table, table)
	}
	return nil
}

// leaseStatements are the SQL texts of a leaseLocker, built once for its
// table and sequence.
type leaseStatements struct {
	acquire, acquireNotify, refresh, refreshBatch, release, inspect, sweep string
}

// leaseGrantNotify is GRANTED in acquireNotify: one NOTIFY per grant.
const leaseGrantNotify = `, LATERAL (SELECT pg_notify('` + leaseGrantChannel + `', encode($1::bytea, 'hex'))) n`

// durable, evaluated in a statement that writes, makes its commit flush
// the WAL even where synchronous_commit is off (raising it to "local" for
// the statement's own transaction): the grant, its token and its expiry
// must survive a crash. It evaluates to ”.
const durable = `left(set_config('synchronous_commit', CASE current_setting('synchronous_commit') WHEN 'off' THEN 'local' ELSE current_setting('synchronous_commit') END, true), 0)`

// The acquire statement: insert the row, or take over the existing one if
// it has expired (by the server's clock) or belongs to the same owner (an
// idempotent acquire keeps the token of a live grant; every other grant
// takes a new one from the sequence). A takeover draws its token in the
// update, once it holds the row's lock: a token drawn before waiting for
// the lock could be lower than that of a grant made while it waited. An
// insert draws its token before inserting (VALUES), which is safe as long
// as no row of the key is deleted in between: the sweep deletes only rows
// expired for LeaseSweepAge, so a statement would have to stall that long
// between its two steps. If nothing was granted, the second
// branch reports how long the holder has left. The row it reads is the one
// visible when the statement started: a holder that inserted the row while
// this statement waited for it is not visible, and the statement then
// returns no row at all (held, remaining unknown). GRANTED is empty, or,
// in the statement for election keys (acquireNotify), announces the grant
// on leaseGrantChannel when the transaction commits, for the key's
// observers (WatchChanges); waiters do not listen to it.
//
// Parameters: $1 id, $2 key, $3 owner (bytea: keys and owners are any
// bytes), $4 TTL in ms.
const leaseAcquireSQL = `
WITH up AS (
	INSERT INTO TABLE AS l (id, key, owner, token, expires_at, ttl_ms)
	VALUES ($1, $2, $3, nextval(SEQ::regclass),
		clock_timestamp() + $4::bigint * interval '1 millisecond', $4::bigint + length(DURABLE))
	ON CONFLICT (id) DO UPDATE SET
		owner = excluded.owner,
		token = CASE WHEN l.owner = excluded.owner AND l.expires_at > clock_timestamp() THEN l.token ELSE nextval(SEQ::regclass) END,
		expires_at = excluded.expires_at,
		ttl_ms = excluded.ttl_ms
	WHERE l.expires_at <= clock_timestamp() OR l.owner = excluded.owner
	RETURNING l.token
)
SELECT token, NULL::bigint FROM up GRANTED
UNION ALL
SELECT NULL, ceil(extract(epoch FROM h.expires_at - clock_timestamp()) * 1000)::bigint
FROM TABLE h WHERE h.id = $1 AND NOT EXISTS (SELECT FROM up)`

// Refresh: owner-checked, and never on an expired row. $1 id, $2 owner, $3
// TTL in ms.
const leaseRefreshSQL = `
UPDATE TABLE SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond', ttl_ms = $3::bigint
WHERE id = $1 AND owner = $2::bytea AND expires_at > clock_timestamp() AND DURABLE = ''`

// Release: owner-checked; the row is kept, expired (so that the next
// acquire of the key updates it in place), and the release is announced on
// leaseChannel when the transaction commits. It returns one row if it
// released. $1 id, $2 owner, $3 notify payload.
const leaseReleaseSQL = `
WITH r AS (
	UPDATE TABLE SET expires_at = clock_timestamp()
	WHERE id = $1 AND owner = $2::bytea AND expires_at > clock_timestamp()
	RETURNING 1
)
SELECT pg_notify('` + leaseChannel + `', $3::text)::text FROM r`

// Inspect: the live holder of $1.
const leaseInspectSQL = `
SELECT owner, token, ceil(extract(epoch FROM expires_at - clock_timestamp()) * 1000)::bigint
FROM TABLE WHERE id = $1 AND expires_at > clock_timestamp()`

// Sweep: rows expired for longer than $1 ms (released, or left by holders
// that never came back) are deleted. It scans the table: no index covers
// expires_at, which keeps the updates HOT.
const leaseSweepSQL = `
DELETE FROM TABLE WHERE expires_at < clock_timestamp() - $1::bigint * interval '1 millisecond'`

func buildLeaseStatements(table, seq string) leaseStatements {
	lit := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
	r := strings.NewReplacer("TABLE", table, "SEQ", lit, "DURABLE", durable)
	return leaseStatements{
		acquire:       r.Replace(strings.ReplaceAll(leaseAcquireSQL, "GRANTED", "")),
		acquireNotify: r.Replace(strings.ReplaceAll(leaseAcquireSQL, "GRANTED", leaseGrantNotify)),
		refresh:       r.Replace(leaseRefreshSQL),
		refreshBatch:  r.Replace(leaseRefreshBatchSQL),
		release:       r.Replace(leaseReleaseSQL),
		inspect:       r.Replace(leaseInspectSQL),
		sweep:         r.Replace(leaseSweepSQL),
	}
}
