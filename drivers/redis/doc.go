// Package redis is the locker driver for Redis on github.com/redis/go-redis/v9:
// a single server, a Redis Cluster, a Sentinel-managed master, or Redlock over
// several independent masters. It registers the URL schemes "redis" and
// "rediss" (TLS), so a blank import is all a program needs:
//
//	import _ "github.com/go-locker/locker/drivers/redis"
//
//	l, err := locker.OpenURL("redis://:password@127.0.0.1:6379/0")
//
// This text is the reference for both Redis drivers: drivers/rueidis has the
// same semantics, scripts and key layout, and its documentation lists only
// where it differs.
//
// # Constructors
//
// As every driver of this module (see docs/writing-a-driver.md), the
// package builds a Locker either from a URL or from clients the program
// already has:
//
//	d, err := redis.Open(ctx, "redis://127.0.0.1:6379/0")
//	d, err := redis.New(ctx, client, nil)            // a redis.UniversalClient
//	d, err := redis.NewRedlock(ctx, clients, &redis.Options{NodeTimeout: 50 * time.Millisecond})
//	l := locker.New(d)
//
// Options carries the settings that do not concern the connection (the
// URL's prefix, node_timeout, drift_factor, max_key_len, token_retention,
// fair and queue_ttl); nil, or a zero field, means the default given below.
// New and NewRedlock make no round trip, leave the clients open on Close,
// and do not watch held locks (see Watching a held lock).
//
// # URL
//
//	redis[s]://[[username]:password@]host[:port][,host[:port]...][/db][?param=value&...]
//
// The port defaults to 6379, the host list to 127.0.0.1:6379, db to 0. What
// the host list means depends on the parameters:
//
//   - one host: a single server;
//   - cluster=true: seed nodes of a Redis Cluster (db must be 0);
//   - sentinel_master=name: Sentinel addresses; the driver follows the
//     master the sentinels name;
//   - several hosts and neither: Redlock over independent masters (use 3 or
//     5; with 2 the quorum is 2 and no node may fail).
//
// Query parameters (an unknown parameter, one given twice, or a malformed
// value is an error wrapping driver.ErrInvalid):
//
//	cluster=false             hosts are Cluster seed nodes
//	sentinel_master=          name of the master the sentinels monitor
//	sentinel_username=        ACL user for the sentinels (needs sentinel_master)
//	sentinel_password=        password for the sentinels (needs sentinel_master)
//	allow_replica=false       accept a replica (single-node and Redlock URLs)
//	allow_eviction=false      accept a server whose maxmemory-policy can evict lock keys (see Eviction)
//	insecure_skip_verify=false  rediss only: do not verify the server certificate
//	client_name=              CLIENT SETNAME for every connection
//	dial_timeout=5s           connecting, handshake included
//	read_timeout=3s           reading one reply (a call's ctx deadline, if earlier, wins)
//	write_timeout=3s          writing one command (idem)
//	pool_size=                connections per node (go-redis default: 10 per CPU)
//	prefix=locker             key prefix (no braces)
//	node_timeout=100ms        Redlock: bound of each call to one node
//	drift_factor=0.01         Redlock: clock drift allowance per unit of TTL, in (0, 0.5)
//	max_key_len=4096          longest key accepted, in bytes
//	token_retention=10m       how long a fencing-token counter outlives its lock
//	fair=true                 queue waiters on the server in arrival order (see Fairness); false: barging
//	queue_ttl=3s              how long a queued waiter's entry outlives its last renewal (at least 30ms)
//
// cluster=true together with sentinel_master is an error.
//
// Open checks the deployment with one round trip (bounded by its context
// and by dial_timeout + read_timeout) and fails with an error naming the address and the cause:
// "server unreachable", "authentication failed", "TLS handshake failed",
// "no valid Redis reply (is this a Redis server? …)". For single-node and Redlock URLs it runs ROLE and
// refuses a replica (an error wrapping driver.ErrInvalid), since a lock
// written to a replica is refused or lost; allow_replica=true skips that.
// A Redlock URL opens when a quorum of its nodes answers.
//
// # Eviction
//
// A Redis whose maxmemory-policy is anything but noeviction (allkeys-lru,
// volatile-ttl, …: lock keys carry a TTL, so the volatile-* policies evict
// them too) can evict a lock key under memory pressure, as a cache shared
// with the locks would. The lock is then gone on the server while its
// holder believes it holds it, and another owner can take it at once. Open
// therefore reads the policy of every server it checks (the single server,
// every Cluster node, the Sentinel master, each Redlock master that
// answers) and refuses one that can evict, with an error naming the policy
// and allow_eviction. It reads CONFIG GET
// maxmemory-policy, and where CONFIG is disabled or renamed, as on managed
// services, INFO memory's maxmemory_policy; a server that answers neither
// is refused too. allow_eviction=true skips the check (no round trip) and
// accepts the risk; a policy changed after Open is not seen. New and
// NewRedlock make no round trip and so do not check.
//
// # Unavailable
//
// Every mode wraps driver.ErrUnavailable around a failure to reach the
// servers at all: refused, reset or timed-out connections, a failed TLS
// handshake or authentication, a server loading its data or whose master or
// cluster is down, a Redlock with too few nodes answering for a quorum. Open
// returns it when its check cannot reach the deployment, and Acquire,
// Refresh, Release, Inspect and Ping when a call cannot. A key another owner
// holds is driver.ErrNotAcquired, never ErrUnavailable, including on a
// Redlock with a minority of nodes down.
//
// # Watching a held lock
//
// The Locker implements driver.HoldWatcher on a single server, a Cluster
// and a Sentinel master (Lockers from Open). Each held key is read on a
// dedicated connection with CLIENT TRACKING ON REDIRECT to a second, RESP2
// connection subscribed to __redis__:invalidate, on the server that
// serves the key (on a Cluster, one such pair per master, opened when a
// watched key is first read there); the server then sends an
// invalidation when the key is deleted, expires, is evicted or is
// written, and the watch reads the key again (re-arming the tracking) and
// reports the grant lost only if the value no longer is the grant's
// "<token>:<owner>". Tracking was chosen over keyspace notifications,
// which need notify-keyspace-events set on the server (often not allowed
// on managed Redis) and are fire-and-forget pub/sub. The redirect form is
// used because go-redis reads RESP3 push messages only when a connection
// is used, not on an idle one, and it parses redirected invalidations as
// pub/sub messages (PayloadSlice). The tracking connection is pinged every
// second, so a broken one is replaced and its keys re-read; a new subscriber connection (a new CLIENT ID) replaces the
// tracking connection at once; a subscriber connection that fails makes
// every key be read again, on the server that serves it then. Two extra
// connections per Locker (per Cluster master), opened with the first
// watch there.
//
// Unless allow_eviction=true, each tracking connection also has NOLOOP,
// and once it is up the Locker's refreshes of the keys its server serves,
// one by one and batched, run on it with a script that reads the key again
// after its PEXPIRE: the key stays tracked, the server sends no
// invalidation for the owner's own refresh, and the watch reads nothing
// after it. A refresh that finds the key gone (its read may have expired
// it, which NOLOOP keeps quiet) has the watch read the key again. NOLOOP
// would also keep back the invalidation of a key evicted to make room for
// one of the tracking connection's commands, which is why it needs
// maxmemory-policy noeviction (Open's check). A refresh that does not
// reach the script on a tracking connection (it broke or is being
// replaced, or a Cluster's slot moved) runs again on the Locker's client.
//
// Not watched: Redlock (a grant is a quorum, so one
// node's change is not a loss; counting per-node invalidations is not
// built), and adopted clients (New, NewRedlock). WatchHold returns an
// error there and package locker relies on renewal alone.
//
// A lock's key deleted (DEL by another client, an operator), overwritten
// by another owner, or evicted closes the holder's Lost() (cause server)
// within milliseconds of the change. A server that restarts empty, or a Sentinel
// failover that loses the grant, closes Lost() once the watch has
// reconnected and re-read the key, within seconds of the server being
// back. Another owner may be granted
// the key before Lost() closes; fencing tokens cover that gap. The
// holder's own renewals, which change the key's TTL and so invalidate it,
// are re-read and raise no alarm. docs/backends/redis.md has the
// measurements.
//
// When the watch connection breaks, nothing is reported: a lost connection
// is not a lost lock. The watch reconnects, reads every watched key again
// (the server forgot what the old connection tracked), and reports a key
// found gone or changed then. Meanwhile renewal and the safe deadline still apply.
//
// Cost: acquire and release stay one EVALSHA each, with nothing added to
// their round trips. The watch adds one GET of the lock key on its own
// connection per grant, and one more per renewal, whose invalidation it
// re-reads; the re-reads that fall due together (the renewals of a batch)
// go out as one pipeline. A key granted again at once can take one more: the
// invalidation of the previous release's DEL may arrive after the new grant
// is watched, and is read rather than guessed stale.
//
// # Keys, round trips, tokens
//
// A key k is stored at "<prefix>:{k}" with the value "<token>:<owner>"; its
// fencing-token counter is "<prefix>:{k}:token", in the same Cluster slot
// (keys containing braces are hashed into the tag), so no script ever fails
// with CROSSSLOT. Acquire, Refresh, Release and Inspect are one EVALSHA each
// (scripts are loaded by EVAL on NOSCRIPT, then run by SHA). Acquire is SET
// NX PX plus the token; a held key answers with the holder's PTTL, which
// package locker uses to wake exactly when a crashed holder's lock expires.
// Refresh compares the owner and PEXPIREs, never reviving an expired key.
// RefreshBatch (driver.BatchRefresher, through which package locker sends
// the renewals that fall due together) is one Refresh script per lock, all
// in one pipeline: one round trip (on a Cluster, one per master, in
// parallel; under Redlock, one per master, each lock decided on its own
// quorum), with each lock's own result.
// Release compares the owner and, unless a waiter is queued (see
// Fairness), DELetes and PUBLISHes on the channel "<prefix>:{k}".
//
// Tokens are max(counter+1, server TIME in microseconds). They strictly
// increase per key across release, expiry and re-acquire; they keep
// increasing when the counter key is lost or the server restarts empty, and
// after a failover to a replica that missed the last writes, provided the
// server clocks never step back (or disagree) by more than token_retention;
// counters of idle keys expire after ttl + token_retention, so they do not
// pile up. Capabilities reports DurableTokens under that assumption.
//
// # Waiting
//
// Locker implements driver.Waiter with pub/sub: one connection per server,
// opened on the first wait and shared by every key and every waiter of the
// Locker; one SUBSCRIBE per key however many goroutines wait for it; a
// subscription counts only once its confirmation was read back. A lost
// connection wakes every waiter, and again after go-redis resubscribed. The
// release script's PUBLISH wakes waiters; an expired
// (crashed) holder is noticed through the PTTL returned by Acquire.
//
// # Fairness
//
// On a single server, a Cluster and Sentinel, waiting Acquires of separate
// Lockers (separate processes) queue on the server and are granted in
// arrival order; Locker implements driver.BlockingAcquirer, so package
// locker waits there. The queue lives beside the lock, in its Cluster slot:
// a list "<prefix>:{k}:q" of waiters and a sorted set "<prefix>:{k}:qt" of
// their entries' expiry times. A release hands the lock to the first live
// waiter (the key holds a reservation for it that nobody else can take)
// and wakes only that waiter, by a message on its Locker's channel
// "<prefix>:wake:<id>" (one SUBSCRIBE per Locker, for its life); the waiter
// then takes the lock with a fresh token. A handoff therefore costs three
// round trips (the waiter's queueing, its grant, the release) whatever the
// number of waiting processes, and nobody else is woken. A free key with
// nobody queued is taken in one round trip with no queue work.
//
// The first waiter in line looks again when the holder's TTL runs out, so
// a holder that crashed or stopped renewing is taken over right after its
// TTL. A waiter that becomes first because the one before it was granted
// the key or left is told the holder's time left by a message on its wake
// channel, with no round trip.
//
// A waiter whose process exited (or was killed) is skipped at once on a
// single server and under Sentinel: the release publishes on its wake
// channel, nobody receives it, and the lock goes to the next waiter. A
// waiter that is cut off keeps its connection open on the server, and on a
// Cluster PUBLISH counts one node's subscribers only: there the entry,
// renewed every queue_ttl/2, and a reservation made for it lapse within
// queue_ttl, and the next waiter goes on. So does the first wait of a
// Locker whose wake channel could not be subscribed: its entry is marked
// "~" as on a Cluster, never skipped for want of a listener. A waiter whose
// connection dropped is skipped too, and joins again at the back of the
// queue when its subscription is back. A cancelled wait removes its entry
// at once and passes on a reservation it was given, leaving nothing
// behind. Tokens and the
// fencing rules are those
// of every grant. Within one Locker, package locker queues its own callers
// and lets one at a time wait on the server. go-redis and rueidis Lockers
// share one queue.
//
// Not promised: a TryAcquire, or a barging waiter, may take a key that is
// free with waiters queued — which happens only after a holder's TTL ran
// out (the first waiter is woken by its own timer at that moment) or a
// reservation lapsed. Redlock does not queue (fair=true with several hosts
// is an error): a queue lives on one server, and a Redlock's purpose is to
// depend on none; its contenders already meet first on one gate master.
//
// fair=false turns the queue off: every waiter is woken by the release's
// PUBLISH and the first to retry wins, as with sync.Mutex. That saves the
// queueing round trip when waiters are few and short-lived, at the cost of
// order: under contention a fast process takes most grants and the server
// work per handoff grows with the number of waiters (docs/benchmarks.md).
//
// # Shared holds
//
// Locker implements driver.SharedLocker on a single server, a Cluster and
// a Sentinel master, so package locker's Semaphore and RWMutex (and
// locker run --limit) work there; Redlock refuses them (below). The
// semaphore and the read-write lock on a key k are locks of their own,
// apart from each other and from the mutex on k: their keys extend the
// lock key with ":sem" and ":rw" and keep its hash tag, so every key of
// one lock is in one Cluster slot. Each holder is a lease of its own in a
// sorted set scored by its expiry on the server's clock (TIME), with its
// token and mode in a hash beside it; every script first drops the
// holders whose lease ended, so a crashed holder's permit comes back at
// its TTL and the others keep theirs. The check of the limit and the grant
// are one script. Tokens come from the mutex's counter (max(counter+1,
// TIME µs)), so every grant of a key, mutex, permit, read or write, gets a
// token above every earlier one. Acquire (when the hold fits or the call
// does not wait), Refresh, Release and Inspect are one EVALSHA each.
//
// A waiting request that does not fit joins a fair queue of the lock, as
// a mutex waiter does, with its mode, limit and TTL. A release, a waiter
// leaving, or the next attempt after a lease ended grants the queue from
// its head while the head fits (a run of readers, one writer,
// or permits while slots last) and wakes those waiters only, on their
// Locker's wake channel; the first waiter left behind looks again when
// the first lease ends. A waiting writer thus blocks every later read
// (writer preference; a one-shot read behind it gets ErrNotAcquired), and
// is granted once the holds in force when it arrived end. An owner's
// request for the hold it has returns the same token with its TTL reset;
// one that holds the read-write lock in the other mode gets ErrInvalid at
// once (release the read hold, then ask for the write hold). A wait whose
// ctx ends leaves the queue, and frees a grant made for it meanwhile,
// before it returns. Shared waits always queue: fair=false applies to the
// mutex only.
//
// # Redlock
//
// Redlock has no shared holds: every SharedLocker call, and package
// locker's Semaphore and RWMutex, fail before any I/O with an error
// matching errors.ErrUnsupported that gives the reason
// (Locker.SharedUnsupported). A limit of n counted on N independent
// masters is not a limit: two majorities overlap in one master at least,
// but each master counts its own holders, so different majorities could
// admit different sets of n holders, more than n in all.
//
// With several hosts, each call goes to every master in parallel, each bounded
// by node_timeout. A grant needs N/2+1 masters and is valid only if
// ttl − elapsed − (ttl×drift_factor + 2ms) > 0; a failed attempt is released
// on every master (also those that did not answer), and the caller retries
// after the holders' expiry or a random delay (split vote). To keep
// concurrent contenders from splitting the vote, all of them first try the
// same master, chosen by a hash of the key; only its winner goes on to the
// others (all go on when that master does not answer). Refresh counts only
// when a quorum refreshed. Tokens: the maximum of the quorum's tokens,
// written back to the quorum before Acquire returns (a second round trip),
// so any later grant, whose quorum intersects this one, gets a larger
// token; see rediscore.Redlock for the exact argument and its assumption
// (no master of the intersection lost its data, or clocks agree). The
// minimum TTL is 3 × node_timeout.
//
// When to use Redlock: to keep locking available while a minority of Redis
// masters is down, when the protected work tolerates the rare double grant.
// When not to: Kleppmann's critique ("How to do distributed locking", 2016)
// holds — Redlock's safety rests on bounded network delay, bounded process
// pauses and bounded clock drift; a GC pause or a clock jump longer than the
// validity lets two clients believe they hold the lock. No lock service
// fixes that alone; fencing does: pass Lock.Token() to the protected
// resource and have it reject a token lower than one it has already seen.
// Redis tokens are monotonic under the assumptions above; if you need
// tokens that are safe without clock assumptions, use etcd (revisions) or
// PostgreSQL.
//
// # Limits
//
//   - A single server or Sentinel master is a single point of truth: with
//     asynchronous replication a failover can lose a granted lock (the new
//     master never saw it), so two holders may coexist until the first one's
//     renewal fails. Fencing tokens still increase (TIME floor).
//   - TTLs are kept in milliseconds; the minimum is 10ms (Redlock: 3 ×
//     node_timeout).
//   - Keys are at most max_key_len bytes (default 4096).
//   - Retries are disabled in the clients Open builds (a retried release
//     could report ErrNotHeld for a lock it did free); adopted clients
//     should set MaxRetries: -1 too, and ContextTimeoutEnabled: true.
//   - A silently dead pub/sub connection (no RST) is not detected by the
//     driver; the waiter then falls back to package locker's timers.
//   - Requires Redis 5.0 or later (the acquire script calls TIME before
//     writing, which needs effects replication); tested with Redis 7.0.
package redis
