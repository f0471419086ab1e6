// Package postgres is the PostgreSQL driver of package locker, on
// github.com/jackc/pgx/v5, with two modes. The default, advisory mode,
// keeps each lock in a session-level advisory lock with a TTL the server
// enforces, and waits block in the server's lock manager. The lease mode
// (mode=lease) keeps each lock in a row of a lease table, with an expiry
// judged by the server's clock, and holds no connection. Both take fencing
// tokens from one sequence. A blank import registers the driver under the
// URL schemes "postgres" and "postgresql":
//
//	import _ "github.com/go-locker/locker/drivers/postgres"
//
//	l, err := locker.OpenURL("postgres://app@db:5432/app?sslmode=verify-full&schema=locks")
//	l, err := locker.OpenURL("postgres://app@pgbouncer:6432/app?mode=lease")
//
// As every driver of this module (see docs/writing-a-driver.md), the
// package has two constructors, and one Locker type for both modes. Open
// builds everything from a URL, in the mode the URL names (as Driver.Open
// and locker.OpenURL do); New adopts a *pgxpool.Pool the program already
// has, in the mode its Options name (nil Options means the defaults:
// advisory mode, schema DefaultSchema, namespace DefaultNamespace):
//
//	d, err := postgres.Open(ctx, "postgres://app@db:5432/app?mode=lease")
//	d, err := postgres.New(ctx, pool, &postgres.Options{Schema: "locks"})
//	d, err := postgres.New(ctx, pool, &postgres.Options{Mode: postgres.ModeLease})
//	l := locker.New(d)
//
// PostgreSQL 14 or later is required (idle_session_timeout).
//
// # The two modes
//
// What each survives (a lock "survives" when no other owner is granted it
// before its TTL runs out and its holder can go on renewing it):
//
//	                                advisory                 lease
//	holder's backend terminated     no: freed at once,       yes
//	                                Lost() within ms
//	server crash or restart         no: freed, Lost()        yes
//	                                within ms
//	network partition               until the TTL            until the TTL: a lease does not
//	                                                         depend on a connection
//	holder paused past its TTL      freed at the TTL         freed at the TTL
//	tokens across a crash           increasing               increasing
//	transaction-mode PgBouncer      refused (ErrPooler)      works
//
// What each costs:
//
//	                                advisory                 lease
//	connections                     one per held lock and    a pool shared by all locks, plus one
//	                                per waiting key, plus    listener per Locker
//	                                one probe per Locker
//	                                while a lock is watched
//	statements                      acquire+release 2,       one per acquire, refresh, release or
//	                                refresh 1, refused       refused acquire
//	                                acquire 2
//	handoff to a waiting process    in the server's lock     a NOTIFY to the waiter's listener;
//	                                manager                  through a pooler, a retry at the
//	                                                         holder's TTL and backoff
//	storage                         nothing                  one row per key in use, swept once
//	                                                         expired for LeaseSweepAge
//
// docs/backends/postgres.md has the measurements behind both tables.
//
// Pick the advisory mode for a modest number of locks on a direct
// connection, when a holder's crash should free its lock at once (its
// session ends with it) rather than at its TTL. Pick the lease mode to hold
// many locks with few connections, behind a transaction-mode pooler
// (PgBouncer), when a lock must outlive connection faults and
// server restarts, or to hand a lock between processes (package locker's
// WithOwner: a lease belongs to its owner string, not to a Locker).
//
// # URL
//
//	postgres://[user[:password]@]host[:port][,host2[:port2]...]/database[?param=value&...]
//
// Our own parameters, removed before the URL is handed to pgx:
//
//   - schema (default "public"): schema of the token sequence
//     <schema>.locker_token_seq. The schema and the sequence are created if
//     missing (serialized across processes); a role without CREATE privilege
//     can use a sequence an administrator created (CACHE 1, NO CYCLE; USAGE
//     granted).
//   - namespace (default "locker"): hashed with every key, so that programs
//     sharing a database do not collide (see AdvisoryKey); it may not
//     contain a NUL byte. Keys and owners are opaque bytes, NUL included.
//   - mode (default "advisory"): "advisory" or "lease"; anything else is an
//     error wrapping driver.ErrInvalid.
//
// pgx's own parameters are accepted: host, port, dbname, user, password,
// passfile, connect_timeout, sslmode, sslkey, sslcert, sslcertmode,
// sslrootcert, sslnegotiation, sslpassword, sslsni, krbspn, krbsrvname,
// target_session_attrs, service, servicefile, min_protocol_version,
// max_protocol_version, channel_binding, require_auth,
// statement_cache_capacity, description_cache_capacity,
// default_query_exec_mode, the pgxpool parameters pool_max_conns (default
// here DefaultPoolMaxConns = 256 in advisory mode and
// DefaultLeasePoolMaxConns = 16 in lease mode, not pgx's 4), pool_min_conns,
// pool_min_idle_conns, pool_max_conn_lifetime, pool_max_conn_idle_time,
// pool_health_check_period, pool_max_conn_lifetime_jitter, and the run-time
// parameters application_name and options. Any other parameter is an error
// wrapping driver.ErrInvalid (pgx would send it to the server as a setting;
// use options=-c name=value for that).
//
// Open connects at once and checks the server: a read-only standby is
// refused (ErrStandby: advisory locks there do not coordinate with the
// primary), so is a connection through a pooler (ErrPooler) and a server
// older than 14 (ErrServerVersion). A server that cannot be reached —
// connection refused or timed out, TLS or authentication failure (a wrong
// password), no free connection slot, a server starting up or shutting
// down — fails Open, and every later call, with an error wrapping
// driver.ErrUnavailable and the server's or pgx's message. No free
// connection slot ("too many clients", SQLSTATE 53300) also wraps a
// *SlotsError that names the cause for the mode (see Connections). A key held by
// someone else is driver.ErrNotAcquired, never ErrUnavailable.
//
// # Lease mode
//
// The lease table <schema>.locker_leases (id bytea PRIMARY KEY, key bytea,
// owner bytea, token bigint, expires_at timestamptz, ttl_ms bigint; WITH
// fillfactor 70) is created with the sequence, serialized the same way. A role without CREATE gets an error that
// names the DDL and GRANTs to run; a table of another shape, or without
// the rights, is refused with the shape or the GRANT wanted. id is the first 16 bytes of
// SHA-256(namespace || 0x00 || key); keys and owners are stored as bytes.
//
// Every operation is one autocommit statement on any pooled connection.
// Acquire inserts the key's row or takes
// over an expired one (ON CONFLICT DO UPDATE … WHERE expires_at <=
// clock_timestamp()), with the token from the sequence and the expiry
// clock_timestamp() + TTL, both by the server's clock; when the key is held
// the same statement returns the holder's remaining TTL
// (driver.HeldError). Refresh and Release are owner-checked updates that
// never touch an expired row; Release marks the row expired rather than
// deleting it, so the next grant of the key updates it in place. Every
// update changes only columns no index covers and so can be HOT. A grant,
// its token and its expiry are
// flushed to the WAL before the reply (synchronous_commit is raised to
// "local" for the statement where it is off). Each lease-mode Locker
// deletes rows expired for longer than Options.SweepAge (default
// LeaseSweepAge) every Options.SweepInterval (default LeaseSweepInterval),
// a scan of the table. Through a pooler (detected as for ErrPooler) statements
// use no named prepared statement.
//
// Waits (AcquireWait): Release notifies the channel "locker_lease" with
// the key's id, and one listener connection per lease-mode Locker
// (outside the pool) LISTENs for every key its callers wait for; expiry
// needs no notification, since Acquire reports the holder's remaining TTL
// and AcquireWait retries at the holder's remaining TTL (and at the latest
// every 2s). Behind a transaction-mode pooler LISTEN does not work, so
// AcquireWait retries at the holder's remaining TTL and with backoff from
// 5ms to 500ms, as it does while the server cannot be reached. In lease
// mode WatchHold returns an error matching errors.ErrUnsupported: a lost
// lease is learned at the next renewal or the safe deadline, which the
// server's expiry never precedes.
//
// Election observers (WatchChanges, driver.ChangeWatcher): Acquire of an
// election's key (under locker.ElectionPrefix; a plain lock's sends
// nothing, and WatchChanges of its key fails with errors.ErrUnsupported)
// also notifies each grant, on the channel "locker_lease_grant", which
// waiters do not listen to; a second listener connection per lease-mode Locker,
// opened by the first observer outside the pool, LISTENs for grants and
// releases, so Election.Observe sees a new term within a round trip of its
// grant. Behind a pooler, and in advisory mode, observers read the holder
// every 100ms instead.
//
// Limits of the lease mode: a lease lost to expiry is learned at the next
// renewal or by the holder's safe deadline, never sooner (no hold watch);
// expiry is judged by the server's wall clock, so a step of that clock
// (not a gradual adjustment) moves every expiry by the step; a takeover
// draws its token after locking the row, but an insert draws it just
// before inserting, so a statement stalled in the server between the two
// for longer than LeaseSweepAge, while the key's old row is swept, could
// grant a token below one granted meanwhile; tokens are as durable as the
// sequence (see the advisory mode's limits).
//
// # How an advisory lock works
//
// Acquire takes a connection from the pool and runs one statement on it:
// pg_try_advisory_lock(key) (session-level), then, inside the lock,
// nextval(<schema>.locker_token_seq) for the fencing token, then
// set_config('idle_session_timeout', TTL) and an application_name of
// "lk/<token hex>/<ttl ms hex>/<owner>" that publishes the holder. The
// connection then stays pinned to the lock — it is never returned to the
// pool while holding it (advisory locks are re-entrant per session, so the
// next borrower would "hold" it too). Refresh is one statement on the pinned
// connection, which restarts the server's idle timer and sets the TTL. A
// refused Acquire runs a second statement to look up how long the holder
// has left (driver.HeldError).
// Release runs pg_advisory_unlock and restores both settings in one
// statement and returns the connection to the pool; after any error the
// connection is closed instead, which ends the session and so the lock. An
// uncontended acquire+release is two statements, a refresh one, a refused
// attempt two, and holding a lock sends nothing.
//
// The TTL is enforced by the server even when the holder is paused with its
// TCP connection up: idle_session_timeout terminates a session that has
// been idle for the TTL, and a session's end frees its locks. The timer
// starts when the server has answered the holder's last statement, so the
// lock never ends before TTL after that statement was sent. A waiter blocked
// in the server is granted the lock no earlier than the TTL, and promptly
// after it. TTLs are whole milliseconds (rounded up),
// from 10ms to MaxTTL (about 24.8 days).
//
// The same statements raise the pinned session's tcp_user_timeout to the
// TTL and its tcp_keepalives_idle to the TTL in whole seconds (once per
// connection and TTL; they are not restored on release, so a pooled
// connection keeps the values of the longest TTL it has held). Both count
// from the last packet the server received, no earlier than the last
// statement, so the server's TCP stack cannot end a partitioned holder's
// session — and free its lock — before the idle timer does, whatever the
// server's own keepalive and retransmission settings.
//
// Fencing tokens come from the sequence (CACHE 1, so strictly increasing
// across sessions), read in the acquire statement after the lock is
// granted. A sequence writes a WAL record once every 32 values, covering
// the next 32; a token is durable once the record covering it is flushed.
// The acquire statement commits on its own and pays for a WAL flush only
// when one is needed: when its own nextval wrote the record (then
// synchronous_commit is raised to "local" for it if it is off), or when the
// WAL is not yet flushed past the record that covers its value (written by
// another transaction still running or committed asynchronously; then a
// transactional logical message makes this commit flush it). Otherwise it
// writes no WAL and does not wait for the disk: about one acquisition in 32
// flushes. Tokens keep increasing across expiry, release, crash and restart
// of the server, also on a server with synchronous_commit=off and right
// after a logged value. A logical-decoding consumer may see the
// "locker" messages.
//
// Waits (AcquireWait, used by package locker's Acquire) block in the
// server's lock manager with pg_advisory_lock: a release or expiry grants
// the lock to the next waiter in the server, with no polling. Cancelling
// the context sends the server a cancel request, which takes the waiter out
// of the queue; a grant that raced the cancel is unlocked before the call
// returns. If the server does not act on the cancel within 250ms, the
// connection is closed and its backend is terminated and waited for. Either
// way nothing is queued or held when the call returns (the clean-up is
// bounded by 1s), and the same holds for an Acquire cut short. Close unlocks
// the locks still held before it closes their connections. The lock_timeout and statement_timeout of the
// session, if set, only make the wait start over, and so does the loss of
// the waiting session (terminated, crash, restart), once the server is
// back.
//
// # When the session ends early
//
// A session that ends for any reason other than its idle timer frees its
// lock at once, before the TTL. The Locker watches every lock held through
// package locker (driver.HoldWatcher, Linux): the pinned socket sits in an
// epoll set for its peer-closed, hang-up and error conditions, which by
// itself costs no traffic and no statement, and Lost() closes as soon as
// the socket reports the end: within milliseconds of pg_terminate_backend,
// a connection reset, a server crash or an immediate shutdown
// (docs/backends/postgres.md has the measurements).
//
// A half-open connection (the server's side reset while the client's
// stays open and silent, as behind a proxy whose backend died) reports
// nothing on the socket. For it, while any lock of a Locker is watched, a
// session probe runs one statement every 200ms, on a connection of its own
// (outside the pool, closed after 30s without a watched lock), that looks
// up in pg_locks whether each watched lock's session still holds it; Lost()
// closes within about a second of the server ending such a session. A waiter may be granted
// the lock a few milliseconds before the old holder hears of the loss: the
// holder's writes in that window are the ones fencing tokens exist for. A
// network partition does not end the session early: the server frees the
// lock no earlier than the TTL after the holder's last statement, and the
// holder's Lost() closes by its safe deadline, before that.
//
// # Connections
//
// Advisory mode: every held lock pins one connection, and so does every
// waiter blocked in the server (package locker uses one per key per
// Locker; each waiting permit is one, queued on its semaphore's gate); a Locker with a watched lock adds one probe connection, outside
// the pool. Size pool_max_conns and the server's max_connections for the
// number of locks held at once plus waiters. Past max_connections Acquire
// fails at once with an error wrapping driver.ErrUnavailable and a
// *SlotsError that says so; past pool_max_conns it waits for a pooled
// connection until its context is done.
//
// Lease mode: no connection is pinned. A Locker uses at most
// pool_max_conns pooled connections (default DefaultLeasePoolMaxConns =
// 16, so that several Lockers fit a default server's max_connections of
// 100), plus one connection of its own for renewals and one for release
// notifications, however many locks it holds. Refreshes that fall due
// together are sent as one statement (up to 1,000 locks) on the renewal
// connection, so renewals of held locks never queue behind acquires for a
// pooled connection, and each Refresh gets its own answer (renewed, or
// driver.ErrNotHeld for that lock alone). Acquires beyond pool_max_conns
// wait for a pooled connection until their context is done. If the server
// has no free slot, the error wraps driver.ErrUnavailable and a *SlotsError
// saying that other clients or Lockers hold the server's connections
// (lower pool_max_conns or raise max_connections); renewals then fall back
// to the pool until the renewal connection can be opened.
//
// PgBouncer and other poolers: not supported in advisory mode (the lease
// mode works through them). Session-level locks and
// settings cannot be pinned through transaction pooling, so the driver
// detects a pooler (the backend pid in the connection handshake differs
// from pg_backend_pid(), as PgBouncer makes up its own) and refuses with
// ErrPooler, before any lock is taken. Connect directly to PostgreSQL.
//
// # Semaphores and read-write locks
//
// The Locker implements driver.SharedLocker in both modes, so package
// locker's Semaphore and RWMutex work on it. A mutex, a semaphore and a
// read-write lock on one key string are three locks: the shared ones hash
// their key with another function (SHA-512/256 with a kind byte) than the
// mutex's SHA-256, so their advisory keys and table ids are apart.
//
// In advisory mode every hold is a session advisory lock on a connection
// pinned to it, like a mutex's: its TTL is the session's
// idle_session_timeout, its token is drawn from the sequence inside the
// lock, and it ends with its session (a crashed holder's permit or read
// hold is free at once). Holds belong to the Locker that took them.
//
//   - A read hold is pg_advisory_lock_shared and a write hold
//     pg_advisory_lock on the read-write lock's key. The server's lock
//     manager queues them: a new request that conflicts with a waiting one
//     waits behind it, so a waiting writer blocks later readers (and a
//     one-shot reader behind it is refused), and waits block in the
//     server without polling. Chosen because the lock manager already is
//     a fair, crash-safe reader-writer lock.
//   - A semaphore is driver.MaxSharedLimit slot keys (the semaphore's base
//     key plus 0 to 1023) and a guard key. A grant is one statement that
//     takes the guard as a transaction lock, counts the held slots in
//     pg_locks and, only while fewer than the request's own limit are
//     held, takes the first free slot below that limit. Every grant is
//     made under the guard, so the count and the grant are one atomic step
//     and callers with different limits never admit more than the largest.
//     The lock manager cannot wait for any one of several slots, so
//     waiting permits queue on a third key, the semaphore's gate (base
//     plus 2046), a session-level lock the lock manager grants in arrival
//     order: the waiting statement takes the gate (blocking in the server)
//     and then tries the slots. Only the gate's holder, the first waiter,
//     retries, after 1ms doubling to 50ms and at once when a permit is
//     released through the same Locker; its grant lets the gate go in the
//     same statement, to the next waiter. The waiters behind it make no
//     statement while they wait, and are granted in arrival order. A
//     waiter that crashes or is cancelled lets the gate go with its
//     session (or its clean-up), so it blocks no one; a permit freed by a
//     crashed holder is taken within about 50ms (TestSharedCrashedHolder).
//     A one-shot Acquire does not queue: it tries the slots at once. Once
//     an attempt has reached the server, a permit wait goes on through a
//     crash or restart of the server, as AcquireWait does.
//
// In lease mode each lock is one row of <schema>.locker_shared (created by
// Open beside the lease table, also in a schema made by an earlier
// version): its holders (owner, mode, token, expiry by the server's clock)
// and its queue of waiters (owner, mode, and an expiry renewed by the
// waiter's attempts: 5s), in arrival order. Each operation is one
// statement calling a PL/pgSQL function that locks the row (creating it)
// and so sees its latest version: the grants of a lock are serialised, and
// expired holders and queue entries are dropped in the same step. Grants
// follow the queue as far as each mode allows: a request (a one-shot one
// counts as queued last) is granted, for a permit, while the holders and
// the waiters ahead of it number fewer than its limit; for a read, while no
// writer holds or waits ahead of it; for a write, while no one holds or
// waits ahead of it. So waiting permits and readers are served in arrival
// order, as writers are, and none can lose every race after a release
// (TestSharedLeaseFIFO). The queue also keeps each waiter's limit, and a
// release, a removed queue entry, and an acquire that dropped an expired
// holder or entry wake only the waiters the acquire rule would now grant
// (a run of readers, one writer, or as many permits as the limit leaves
// room for): one NOTIFY each, whose payload is the lock's id and a hash of
// the waiter's owner, heard by that waiter's listener alone. Only the first
// waiter retries at the holders' earliest expiry, and its acquire wakes the
// rest it lets in (and, granted, tells the next first waiter when a holder
// expires sooner than that waiter's fallback); every waiter also retries at the latest every 2s, and
// all of them once after the listener reconnects. Through a pooler waits
// fall back to the TTL and backoff (at most 50ms for the first waiter in
// the queue, whom the others wait for). The functions are versioned
// (locker_shared_acquire_v4, _change_v4, _wake_v4; Open makes them): the
// limit is enforced by the statement that grants, whichever version runs
// it, so old and new clients can share a lock during a rolling upgrade;
// there an old client's release wakes new waiters (they also hear the
// lock-wide NOTIFY), but a new client's release does not wake old waiters,
// which retry on their timers (at most 2s, or the holders' expiry). A wait that ends with its context
// sends one clean-up statement, bounded by 250ms, that drops its entry (two
// when a grant's reply was cut off); no connection is held while waiting.
// A waiter that dies holds back the waiters behind it until its entry
// expires (at most 5s).
//
// In both modes an owner's second request for the same hold refreshes it
// and returns the same token, and a request for the other side of a
// read-write lock its owner holds is driver.ErrInvalid at once: there are
// no upgrades (release the read hold, then acquire the write hold).
//
// # Keys
//
// A key maps to the 64-bit advisory key AdvisoryKey(namespace, key): the
// first 8 bytes of SHA-256(namespace || 0x00 || key). Among n keys in use at
// once, two collide with probability about n²/2^65 (one in 37 million for a
// million keys); colliding keys exclude each other but never let two owners
// hold one key. Advisory locks taken by other programs with
// pg_advisory_lock(bigint) share the same space; the hash makes a clash
// with their (usually small) numbers as unlikely as any collision.
//
// # Limits of the advisory mode
//
//   - A lock belongs to the session, so only the Locker that acquired it
//     can refresh or release it; the same owner string through another
//     Locker gets driver.ErrNotHeld (and ErrNotAcquired on Acquire).
//   - A Refresh or Release whose context ends mid-statement closes the
//     connection, and with it the lock (the error then wraps both the
//     context's error and driver.ErrNotHeld).
//   - Inspect and the remaining TTL of driver.HeldError come from
//     pg_locks and pg_stat_activity. Owners longer than 34 bytes or not
//     printable ASCII are shown as "#" and a hash prefix to other Lockers.
//     Roles that cannot see other roles' activity get Remaining 0. While a
//     lock is held, application_name of its session is the holder record.
//   - Tokens are as durable as the sequence: a restore of an older backup,
//     or a failover to an asynchronous replica that had not received the
//     latest sequence WAL, can hand out a token again.
//   - Session watching needs Linux and a socket; elsewhere, or through a
//     custom connection that is not one, a session's end is learned at the
//     next renewal (within TTL/3) or at the safe deadline.
package postgres
