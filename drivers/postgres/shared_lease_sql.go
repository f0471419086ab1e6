package postgres

import (
	"strconv"
	"strings"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5"
)

// SharedTableName is the name of the table of shared holds (semaphores and
// read-write locks) in lease mode, in the schema beside the lease table.
const SharedTableName = "locker_shared"

// sharedIntentTTLms is how long a waiter's queue entry stays in force
// after its last attempt: a waiter retries at least every
// leaseWaitFallback, so its entry lasts while it waits, and a waiter that
// died while waiting holds back the waiters behind it for at most this
// long.
const sharedIntentTTLms = 5000

// sharedTableDDL creates the table of shared holds: one row per lock (id
// is the lock's hash, see sharedLeaseID), its holders as parallel arrays
// (owner, mode, token, expiry on the server's clock) and its waiters
// (owner, mode, expiry of the entry) in arrival order. Its functions
// change a row under the row's lock, one statement per operation.
func sharedTableDDL(table string) string {
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
	id bytea PRIMARY KEY,
	key bytea NOT NULL,
	h_owner bytea[] NOT NULL DEFAULT '{}',
	h_mode smallint[] NOT NULL DEFAULT '{}',
	h_token bigint[] NOT NULL DEFAULT '{}',
	h_exp timestamptz[] NOT NULL DEFAULT '{}',
	w_owner bytea[] NOT NULL DEFAULT '{}',
	w_exp timestamptz[] NOT NULL DEFAULT '{}',
	w_mode smallint[] NOT NULL DEFAULT '{}',
	w_lim int[] NOT NULL DEFAULT '{}'
) WITH (fillfactor = 70)`
}

// sharedTableUpgrade adds to a shared table made by an earlier version the
// waiters' modes (the earliest queued only writers: an entry without a
// mode is a writer's) and their semaphore limits (an entry without one, or
// a queue whose limits an earlier version's acquire left out of step with
// its owners, is woken as if its limit were MaxSharedLimit).
func sharedTableUpgrade(table string) string {
	return `ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS w_mode smallint[] NOT NULL DEFAULT '{}',
	ADD COLUMN IF NOT EXISTS w_lim int[] NOT NULL DEFAULT '{}'`
}

// sharedFuncDDL creates the functions of the shared table. Each runs in
// the caller's one statement; it locks the lock's row (creating it) and
// sees its latest version, so the grants of one lock are serialised.
//
// acquire($id, $key, $owner, $mode, $limit, $ttl_ms, $wait) drops expired
// holders and queue entries and grants in arrival order, as far as the
// mode allows: the waiters ahead of a request are those queued before its
// own entry (all of them for a request not queued), and it is granted, for
// a permit, while the holders and the waiters ahead number fewer than
// $limit; for a read, while no writer holds or waits ahead; for a write,
// while no one holds or waits ahead. The same owner in the same mode is
// refreshed and keeps its token; in the other mode it is refused as an
// upgrade (conflict). A refused waiting request adds (or renews) its entry
// at the back of the queue. It returns the token, or the holders' earliest
// remaining TTL in ms and whether the request is first in the queue (only
// holders are in its way). A granted request that was first in the queue
// notifies the new first waiter (as wake does) when a holder expires
// sooner than that waiter's fallback retry, since it alone retries then.
//
// change($id, $owner, $mode, $ttl_ms) renews the owner's live hold in
// $mode, or with a NULL $ttl_ms removes it, or with $mode 0 removes its
// queue entry; it reports whether it found what it changes.
//
// wake($id, $skip, $head) announces, for each waiter of the lock's queue
// but $skip that the acquire rule would now grant, and with $head for the
// first waiter too, a NOTIFY on leaseChannel whose payload names the lock
// and the waiter (see sharedWakePayload), so that only those waiters
// retry. A release calls it, and so does an acquire that dropped an
// expired holder or entry, and the removal of a queue entry (with $head
// when it was the first: the new first waiter learns the holders' expiry,
// which it alone retries at). The
// waiters' limits come from w_lim, kept in step with the queue by acquire;
// an entry whose limit is unknown counts as MaxSharedLimit, which can only
// wake too many.
const sharedFuncTemplate = `
CREATE OR REPLACE FUNCTION FN_acquire(p_id bytea, p_key bytea, p_owner bytea, p_mode int, p_lim int, p_ttl bigint, p_wait bool,
	OUT token bigint, OUT remaining bigint, OUT conflict bool, OUT first bool) LANGUAGE plpgsql AS $f$
DECLARE
	r TABLE%ROWTYPE;
	t timestamptz := clock_timestamp();
	ho bytea[] := '{}'; hm smallint[] := '{}'; ht bigint[] := '{}'; he timestamptz[] := '{}';
	wo bytea[] := '{}'; we timestamptz[] := '{}'; wm smallint[] := '{}'; wl int[] := '{}';
	i int; mine int := 0; writer bool := false; earliest timestamptz; ok bool;
	pos int; ahead int := 0; wahead bool := false; dropped bool := false; aligned bool;
BEGIN
	conflict := false; first := false;
	LOOP -- the sweep may delete the row between the two statements
		INSERT INTO TABLE (id, key) VALUES (p_id, p_key) ON CONFLICT (id) DO NOTHING;
		SELECT * INTO r FROM TABLE WHERE id = p_id FOR UPDATE;
		EXIT WHEN FOUND;
	END LOOP;
	FOR i IN 1 .. coalesce(array_length(r.h_owner, 1), 0) LOOP
		IF r.h_exp[i] <= t THEN dropped := true; CONTINUE; END IF;
		ho := ho || r.h_owner[i]; hm := hm || r.h_mode[i]; ht := ht || r.h_token[i]; he := he || r.h_exp[i];
		IF r.h_owner[i] = p_owner THEN mine := array_length(ho, 1); END IF;
		IF r.h_mode[i] = 3 THEN writer := true; END IF;
		IF earliest IS NULL OR r.h_exp[i] < earliest THEN earliest := r.h_exp[i]; END IF;
	END LOOP;
	aligned := array_length(r.w_lim, 1) IS NOT DISTINCT FROM array_length(r.w_owner, 1);
	FOR i IN 1 .. coalesce(array_length(r.w_owner, 1), 0) LOOP
		IF r.w_exp[i] <= t THEN dropped := true; CONTINUE; END IF;
		wo := wo || r.w_owner[i]; we := we || r.w_exp[i]; wm := wm || coalesce(r.w_mode[i], 3::smallint);
		wl := array_append(wl, CASE WHEN aligned THEN r.w_lim[i] END);
	END LOOP;
	pos := array_position(wo, p_owner);
	FOR i IN 1 .. coalesce(pos - 1, array_length(wo, 1), 0) LOOP
		ahead := ahead + 1;
		IF wm[i] = 3 THEN wahead := true; END IF;
	END LOOP;
	IF mine > 0 THEN
		IF hm[mine] <> p_mode THEN
			conflict := true;
			RETURN;
		END IF;
		he[mine] := t + p_ttl * interval '1 millisecond';
		token := ht[mine];
		ok := true;
	ELSIF p_mode = 1 THEN
		ok := coalesce(array_length(ho, 1), 0) + ahead < p_lim;
	ELSIF p_mode = 2 THEN
		ok := NOT writer AND NOT wahead;
	ELSE
		ok := coalesce(array_length(ho, 1), 0) = 0 AND ahead = 0;
	END IF;
	IF ok AND token IS NULL THEN
		token := nextval(SEQ::regclass);
		ho := ho || p_owner; hm := hm || p_mode::smallint; ht := ht || token; he := he || (t + p_ttl * interval '1 millisecond');
	END IF;
	IF ok AND pos IS NOT NULL THEN
		wo := wo[:pos-1] || wo[pos+1:]; we := we[:pos-1] || we[pos+1:]; wm := wm[:pos-1] || wm[pos+1:]; wl := wl[:pos-1] || wl[pos+1:];
	ELSIF NOT ok AND p_wait AND pos IS NOT NULL THEN
		we[pos] := t + INTENT * interval '1 millisecond'; wl[pos] := p_lim;
	ELSIF NOT ok AND p_wait THEN
		wo := wo || p_owner; we := we || (t + INTENT * interval '1 millisecond'); wm := wm || p_mode::smallint; wl := wl || p_lim;
	END IF;
	UPDATE TABLE SET h_owner = ho, h_mode = hm, h_token = ht, h_exp = he, w_owner = wo, w_exp = we, w_mode = wm, w_lim = wl WHERE id = p_id;
	IF dropped THEN PERFORM FN_wake(p_id, p_owner, false); END IF;
	IF ok AND pos = 1 AND array_length(wo, 1) > 0
		AND least(earliest, t + p_ttl * interval '1 millisecond') < t + FALLBACK * interval '1 millisecond' THEN
		-- The new first waiter retries at the holders' expiry: tell it when, if sooner than its fallback.
		PERFORM pg_notify(CHAN, encode(p_id, 'hex') || ':' || encode(substring(sha256(wo[1]) FROM 1 FOR 8), 'hex'));
	END IF;
	first := NOT ok AND p_wait AND ahead = 0;
	IF NOT ok AND earliest IS NOT NULL THEN
		remaining := ceil(extract(epoch FROM earliest - t) * 1000)::bigint;
	END IF;
END $f$
;;
CREATE OR REPLACE FUNCTION FN_change(p_id bytea, p_owner bytea, p_mode int, p_ttl bigint) RETURNS bool LANGUAGE plpgsql AS $f$
DECLARE
	r TABLE%ROWTYPE;
	t timestamptz := clock_timestamp();
	i int;
BEGIN
	SELECT * INTO r FROM TABLE WHERE id = p_id FOR UPDATE;
	IF NOT FOUND THEN RETURN false; END IF;
	IF p_mode = 0 THEN
		i := array_position(r.w_owner, p_owner);
		IF i IS NULL THEN RETURN false; END IF;
		UPDATE TABLE SET w_owner = w_owner[:i-1] || w_owner[i+1:], w_exp = w_exp[:i-1] || w_exp[i+1:],
			w_mode = w_mode[:i-1] || w_mode[i+1:],
			w_lim = CASE WHEN array_length(w_lim, 1) = array_length(w_owner, 1) THEN w_lim[:i-1] || w_lim[i+1:] ELSE '{}' END
			WHERE id = p_id;
		PERFORM FN_wake(p_id, NULL, i = 1);
		RETURN true;
	END IF;
	i := array_position(r.h_owner, p_owner);
	IF i IS NULL OR r.h_mode[i] <> p_mode OR r.h_exp[i] <= t THEN RETURN false; END IF;
	IF p_ttl IS NOT NULL THEN
		UPDATE TABLE SET h_exp[i] = t + p_ttl * interval '1 millisecond' WHERE id = p_id;
	ELSE
		UPDATE TABLE SET h_owner = h_owner[:i-1] || h_owner[i+1:], h_mode = h_mode[:i-1] || h_mode[i+1:],
			h_token = h_token[:i-1] || h_token[i+1:], h_exp = h_exp[:i-1] || h_exp[i+1:] WHERE id = p_id;
		PERFORM FN_wake(p_id, NULL, false);
	END IF;
	RETURN true;
END $f$
;;
CREATE OR REPLACE FUNCTION FN_wake(p_id bytea, p_skip bytea, p_head bool) RETURNS void LANGUAGE plpgsql AS $f$
DECLARE
	r TABLE%ROWTYPE;
	t timestamptz := clock_timestamp();
	i int; m int; ok bool; held int := 0; writer bool := false; ahead int := 0; aligned bool;
	pre text := encode(p_id, 'hex') || ':';
BEGIN
	SELECT * INTO r FROM TABLE WHERE id = p_id;
	IF NOT FOUND THEN RETURN; END IF;
	FOR i IN 1 .. coalesce(array_length(r.h_owner, 1), 0) LOOP
		CONTINUE WHEN r.h_exp[i] <= t;
		held := held + 1;
		IF r.h_mode[i] = 3 THEN writer := true; END IF;
	END LOOP;
	aligned := array_length(r.w_lim, 1) IS NOT DISTINCT FROM array_length(r.w_owner, 1);
	FOR i IN 1 .. coalesce(array_length(r.w_owner, 1), 0) LOOP
		CONTINUE WHEN r.w_exp[i] <= t;
		m := coalesce(r.w_mode[i], 3);
		ok := CASE m WHEN 1 THEN held + ahead < coalesce(CASE WHEN aligned THEN r.w_lim[i] END, MAXLIM)
			WHEN 2 THEN NOT writer ELSE held = 0 AND ahead = 0 END;
		IF (ok OR p_head AND ahead = 0) AND r.w_owner[i] IS DISTINCT FROM p_skip THEN
			PERFORM pg_notify(CHAN, pre || encode(substring(sha256(r.w_owner[i]) FROM 1 FOR 8), 'hex'));
		END IF;
		EXIT WHEN m = 3 OR held + ahead >= MAXLIM;
		ahead := ahead + 1;
	END LOOP;
END $f$`

// sharedLeaseStatements are the shared-hold SQL texts of a leaseLocker.
type sharedLeaseStatements struct {
	acquire, refresh, release, inspect, sweep string
}

// sharedFuncs returns the DDL statements of the shared table's functions,
// named by sharedFuncNames, for table and the sequence seq (quoted and
// schema-qualified).
func sharedFuncs(schema, table, seq string) []string {
	lit := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
	n := sharedFuncNames(schema)
	r := strings.NewReplacer("FN_acquire", n[0], "FN_change", n[1], "FN_wake", n[2],
		"TABLE", table, "SEQ", lit, "INTENT", strconv.Itoa(sharedIntentTTLms),
		"CHAN", "'"+leaseChannel+"'", "FALLBACK", strconv.FormatInt(leaseWaitFallback.Milliseconds(), 10), "MAXLIM", strconv.Itoa(driver.MaxSharedLimit))
	return strings.Split(r.Replace(sharedFuncTemplate), "\n;;\n")
}

// sharedFuncNames are the quoted, schema-qualified names of the functions
// acquire, change and wake of the shared table. Their names carry a
// version: an earlier version's functions stay, for the clients that still
// call them, and Open makes these where they are missing. Version 3 queued
// waiters of every mode; version 4 keeps their limits too and wakes only
// the waiters a change lets in. Both enforce the limit in the statement
// that grants, so clients of the two versions can share a lock during a
// rolling upgrade; only wake-ups cross badly (a version-3 acquire leaves
// the queue's limits out of step, which wakes more; a version-4 release
// does not wake version-3 waiters, which retry on their timers).
func sharedFuncNames(schema string) [3]string {
	var n [3]string
	for i, f := range []string{"acquire_v4", "change_v4", "wake_v4"} {
		n[i] = pgx.Identifier{schema, SharedTableName + "_" + f}.Sanitize()
	}
	return n
}

func buildSharedLeaseStatements(schema, table string) sharedLeaseStatements {
	n := sharedFuncNames(schema)
	return sharedLeaseStatements{
		acquire: `SELECT token, remaining, conflict, first, ` + durable + ` FROM ` + n[0] + `($1, $2, $3, $4, $5, $6, $7)`,
		release: `SELECT ` + n[1] + `($1, $2, $3, NULL), NULL::text`,
		refresh: `SELECT ` + n[1] + `($1, $2, $3, $4), ` + durable,
		inspect: `SELECT o, m, k, ceil(extract(epoch FROM e - clock_timestamp()) * 1000)::bigint
FROM ` + table + ` s, unnest(s.h_owner, s.h_mode, s.h_token, s.h_exp) AS h(o, m, k, e)
WHERE s.id = $1 AND e > clock_timestamp() ORDER BY k`,
		// Rows whose every holder and writer entry expired more than $1
		// ms ago. A concurrent grant locks the row first; the delete then
		// sees its version and keeps the row (and acquire makes the row
		// again if it was deleted in between).
		sweep: `DELETE FROM ` + table + ` s WHERE
	coalesce((SELECT max(e) FROM unnest(s.h_exp) e), '-infinity') < clock_timestamp() - $1::bigint * interval '1 millisecond'
	AND coalesce((SELECT max(e) FROM unnest(s.w_exp) e), '-infinity') < clock_timestamp() - $1::bigint * interval '1 millisecond'`,
	}
}
