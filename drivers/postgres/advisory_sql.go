package postgres

import "strings"

// statements are the SQL texts of a Locker in advisory mode, built once for
// its sequence.
type statements struct {
	// acquire[wait][tcp]: pg_try_advisory_lock or pg_advisory_lock,
	// without or with raising the session's TCP timeouts.
	acquire             [2][2]string
	holder              string
	refresh, refreshTCP string
	release, inspect    string
}

// The acquire statement, in order (each OFFSET 0 subquery is evaluated
// before the level above it):
//  1. read the session's idle_session_timeout and application_name, to
//     restore them on release;
//  2. take the session-level advisory lock, only if the backend is the one
//     we connected to (a pooler in between would hand our session lock to
//     other clients);
//  3. if granted, draw the fencing token from the sequence, inside the
//     lock, and note whether that nextval wrote the sequence's WAL record
//     (it then assigned a transaction id: a sequence logs once every 32
//     values, covering the next 32) and the WAL insert position after it;
//  4. if granted, arm idle_session_timeout = TTL (the server ends the
//     session, and so frees the lock, after TTL without a statement),
//     publish the holder in application_name and, when the Go side says so
//     (TCP), raise the session's tcp_user_timeout and tcp_keepalives_idle to
//     the TTL, so that the server's TCP stack cannot end a partitioned
//     session before its idle timer does;
//  5. make the token durable before the reply, paying for a WAL flush only
//     when one is needed. The token is durable once the WAL record of the
//     sequence that covers it is flushed. If this nextval wrote that record,
//     the implicit transaction commits with a flush (synchronous_commit is
//     raised to "local" for it if it is off). Otherwise the record was
//     written earlier, by some other nextval, whose transaction may not
//     have flushed it yet (still running, or committed asynchronously): if
//     the WAL is not flushed up to the position read after our nextval, a
//     transactional logical message gives this transaction a WAL record and
//     a transaction id, so its commit flushes everything before it too.
//     When the WAL is flushed already, nothing is written and the commit
//     does not wait for the disk;
//
// When the lock is refused, a second statement (holder) looks the holder up:
// a lookup in this one would cost every acquisition the set-up of its plan
// (pg_locks and pg_stat_activity), about a fifth of an uncontended
// acquire+release, even when it does not run.
//
// Parameters: $1 advisory key, $2 expected backend pid, $3 TTL in ms (text),
// $4 TTL in ms (hex), $5 owner tag, and with TCP $6 the keepalive idle time
// in seconds.
const acquireTemplate = `
SELECT t.ok, t.tok, t.ist, t.app,
	CASE WHEN t.ok THEN
		set_config('idle_session_timeout', $3, false)
		|| set_config('application_name', 'lk/' || to_hex(t.tok) || '/' || $4 || '/' || $5, false)
		TCP
		|| CASE WHEN t.logged OR pg_current_wal_flush_lsn() < t.lsn THEN
			CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) ELSE '' END
			|| CASE WHEN NOT t.logged THEN pg_logical_emit_message(true, 'locker', '')::text ELSE '' END
		ELSE '' END
	END
FROM (
	SELECT s.ok, s.ist, s.app, s.tok,
		CASE WHEN s.ok THEN pg_current_xact_id_if_assigned() IS NOT NULL END AS logged,
		CASE WHEN s.ok THEN pg_current_wal_insert_lsn() END AS lsn
	FROM (
		SELECT s.ok, s.ist, s.app, CASE WHEN s.ok THEN nextval(SEQ::regclass) END AS tok
		FROM (
			SELECT current_setting('idle_session_timeout') AS ist,
				current_setting('application_name') AS app,
				CASE WHEN pg_backend_pid() = $2 THEN LOCKFN($1) END AS ok
			OFFSET 0
		) s
		OFFSET 0
	) s
	OFFSET 0
) t`

// tcpRaise sets the session's TCP timeouts from the TTL: tcp_user_timeout
// (how long sent data may stay unacknowledged, and on Linux also the
// earliest a keepalive failure can end the connection) to the TTL in ms,
// tcp_keepalives_idle to the TTL in whole seconds. Both count from the last
// packet the server received or sent, which is no earlier than the last
// statement, so neither can end a partitioned session before the TTL has
// passed since that statement. They are not restored on release: a
// connection keeps the values for the longest TTL it has held, which only
// makes the server wait longer on a silent client.
const tcpRaise = `|| set_config('tcp_user_timeout', TTLPARAM, false) || set_config('tcp_keepalives_idle', IDLEPARAM, false)`

func buildStatements(seq string) statements {
	lit := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
	acq := strings.ReplaceAll(acquireTemplate, "SEQ", lit)
	raise := func(sql, ttl, idle string) string {
		return strings.ReplaceAll(strings.ReplaceAll(sql, "TTLPARAM", ttl), "IDLEPARAM", idle)
	}
	var st statements
	for w, lockFn := range []string{
		"pg_try_advisory_lock($1)",
		// pg_advisory_lock returns void, whose text form is ''.
		"(pg_advisory_lock($1)::text = '')",
	} {
		base := strings.ReplaceAll(acq, "LOCKFN($1)", lockFn)
		st.acquire[w][0] = strings.ReplaceAll(base, "TCP", "")
		st.acquire[w][1] = strings.ReplaceAll(base, "TCP", raise(tcpRaise, "$3", "$6"))
	}
	// The holder of a refused key as "<state>/<idle ms>/<application_name>",
	// for its remaining TTL. $1 and $2: the key's halves as in pg_locks.
	st.holder = `
SELECT a.state || '/' || (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint || '/' || a.application_name
FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
LIMIT 1`
	st.refresh = `SELECT set_config('idle_session_timeout', $1, false), set_config('application_name', $2, false)`
	st.refreshTCP = `SELECT set_config('idle_session_timeout', $1, false), set_config('application_name', $2, false) ` +
		raise(tcpRaise, "$1", "$3")
	st.release = `SELECT pg_advisory_unlock($1), set_config('idle_session_timeout', $2, false), set_config('application_name', $3, false)`
	st.inspect = `
SELECT a.application_name, a.state, (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $1 AND l.objid = $2 AND l.objsubid = 1
LIMIT 1`
	return st
}
