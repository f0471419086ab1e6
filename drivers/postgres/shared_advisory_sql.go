package postgres

import (
	"strings"

	"github.com/go-locker/locker/driver"
)

// sharedStatements are the SQL texts of the shared holds of a Locker in
// advisory mode, built once for its sequence; each is indexed by
// driver.SharedMode.
type sharedStatements struct {
	// acquire[mode][wait][tcp], as statements.acquire. The permit's have
	// a sixth parameter, the semaphore's limit (int4), and then the
	// keepalive idle time. A waiting permit's statement first waits in
	// the server for the semaphore's gate (see permitGate), then tries
	// the slots; granted, it lets the gate go, refused, it keeps it.
	acquire [4][2][2]string
	// permitRetry[tcp] is the permit's try by a session that holds the
	// gate: granted, it lets the gate go.
	permitRetry [2]string
	release     [4]string
}

// Permit slots: a semaphore's base key (its shared key with the low 11
// bits cleared) plus 0 to MaxSharedLimit-1 are its slots; base plus
// permitGuard is the guard that serialises its grants; base plus
// permitGate is the gate its waiting requests queue on, a session-level
// lock the lock manager grants in arrival order: only its holder, the
// first waiter, tries the slots, and it lets the gate go when granted (or
// when its wait ends; its session's end frees it too).
const (
	permitSpan  = 2048
	permitGuard = permitSpan - 1
	permitGate  = permitSpan - 2
)

// permitGated is permitLock for a session that holds the gate: a grant
// lets the gate go (the session then holds its slot alone, as release
// expects). permitQueued waits for the gate first (CASE fixes the order).
const (
	permitGated = `(SELECT CASE WHEN p.ok THEN pg_advisory_unlock($1::bigint + ` + "2046" + `) ELSE false END
	FROM (SELECT ` + permitLock + ` AS ok OFFSET 0) p)`
	permitQueued = `(CASE WHEN pg_advisory_lock($1::bigint + ` + "2046" + `)::text = '' THEN ` + permitGated + ` END)`
)

// permitLock is the lock expression of a permit's acquire: under the
// guard (a transaction-level lock, released when the statement ends) it
// counts the semaphore's granted slots in pg_locks, and only while fewer
// than the limit ($6) are held takes the first free slot among 0..limit-1.
// Every grant of the semaphore is made under its guard, so the count and
// the grant are one atomic step; releases (and sessions that end) only
// lower the count. The count subquery refers to the guard's column so that
// it runs after the guard is taken.
const permitLock = `(SELECT CASE WHEN g.c < $6::int THEN
		EXISTS (SELECT FROM generate_series(0, $6::int - 1) i WHERE pg_try_advisory_lock($1::bigint + i))
	ELSE false END
	FROM (SELECT (SELECT count(*) FROM pg_locks k
			WHERE k.locktype = 'advisory' AND k.granted AND k.objsubid = 1
				AND k.database = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND k.classid = (($1::bigint >> 32) & 4294967295)::oid
				AND k.objid::bigint >= ($1::bigint & 4294967295)
				AND k.objid::bigint < ($1::bigint & 4294967295) + ` + "1024" + `
				AND x.g = '') AS c
		FROM (SELECT pg_advisory_xact_lock($1::bigint + 2047)::text AS g OFFSET 0) x
		OFFSET 0) g)`

// sharedHoldersSQL lists the holders of a shared lock from pg_locks: the
// lock mode, application_name, state and idle time of each session that
// holds an advisory key k with lo ≤ objid < hi (classid = $1; $2, $3 = lo,
// hi).
const sharedHoldersSQL = `
SELECT l.mode, a.application_name, a.state, (extract(epoch FROM clock_timestamp() - a.state_change) * 1000)::bigint
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND l.classid = $1 AND l.objid::bigint >= $2 AND l.objid::bigint < $3`

func buildSharedStatements(seq string) sharedStatements {
	lit := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
	acq := strings.ReplaceAll(acquireTemplate, "SEQ", lit)
	raise := func(idle string) string {
		return strings.ReplaceAll(strings.ReplaceAll(tcpRaise, "TTLPARAM", "$3"), "IDLEPARAM", idle)
	}
	var st sharedStatements
	fns := map[driver.SharedMode][2]string{
		driver.SharedRead:  {"pg_try_advisory_lock_shared($1)", "(pg_advisory_lock_shared($1)::text = '')"},
		driver.SharedWrite: {"pg_try_advisory_lock($1)", "(pg_advisory_lock($1)::text = '')"},
	}
	for mode, fn := range fns {
		for w := range 2 {
			base := strings.ReplaceAll(acq, "LOCKFN($1)", fn[w])
			st.acquire[mode][w][0] = strings.ReplaceAll(base, "TCP", "")
			st.acquire[mode][w][1] = strings.ReplaceAll(base, "TCP", raise("$6"))
		}
	}
	for i, fn := range []string{permitLock, permitQueued, permitGated} {
		base := strings.ReplaceAll(acq, "LOCKFN($1)", fn)
		for tcp, sql := range []string{strings.ReplaceAll(base, "TCP", ""), strings.ReplaceAll(base, "TCP", raise("$7"))} {
			if i < 2 {
				st.acquire[driver.SharedPermit][i][tcp] = sql
			} else {
				st.permitRetry[tcp] = sql
			}
		}
	}
	restore := `, set_config('idle_session_timeout', $2, false), set_config('application_name', $3, false)`
	st.release[driver.SharedRead] = `SELECT pg_advisory_unlock_shared($1)` + restore
	st.release[driver.SharedWrite] = `SELECT pg_advisory_unlock($1)` + restore
	// A permit's session holds its one slot and nothing else.
	st.release[driver.SharedPermit] = `SELECT (pg_advisory_unlock_all()::text = '' AND $1::bigint IS NOT NULL)` + restore
	return st
}
