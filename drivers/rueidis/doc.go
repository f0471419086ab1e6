// Package rueidis is the locker driver for Redis on github.com/redis/rueidis:
// a single server, a Redis Cluster, a Sentinel-managed master, or Redlock over
// several independent masters. It has the semantics, scripts and key layout
// of drivers/redis (both are thin adapters over the same internal core), so
// the two drivers interoperate on one server; it differs in how it waits. It
// registers the URL scheme "rueidis", so a blank import is all a program
// needs:
//
//	import _ "github.com/go-locker/locker/drivers/rueidis"
//
//	l, err := locker.OpenURL("rueidis://:password@127.0.0.1:6379/0")
//
// New and NewRedlock adopt rueidis clients the program already has;
// NewWithClientOption builds the clients from a rueidis.ClientOption.
//
// # URL
//
//	rueidis://[[username]:password@]host[:port][,host[:port]...][/db][?param=value&...]
//
// The port defaults to 6379, the host list to 127.0.0.1:6379, db to 0.
// IPv6 literals are written in brackets ([::1]:6379). What the host list
// means depends on the parameters:
//
//   - one host: a single server;
//   - cluster=true: seed nodes of a Redis Cluster (db must be 0);
//   - sentinel_master=name: Sentinel addresses; rueidis follows the master
//     the sentinels name;
//   - several hosts and neither: Redlock over independent masters (use 3 or
//     5; with 2 the quorum is 2 and no node may fail).
//
// Query parameters (an unknown parameter, one given twice, or a malformed
// value is an error wrapping driver.ErrInvalid; the names are those of
// drivers/redis where they mean the same):
//
//	cluster=false               hosts are Cluster seed nodes
//	sentinel_master=            name of the master the sentinels monitor
//	sentinel_username=          ACL user for the sentinels (needs sentinel_master)
//	sentinel_password=          password for the sentinels (needs sentinel_master)
//	allow_replica=false         accept a replica (single-node and Redlock URLs)
//	allow_eviction=false        accept a server whose maxmemory-policy can evict lock keys (see Eviction)
//	tls=false                   connect with TLS (the "rediss" of drivers/redis)
//	insecure_skip_verify=false  with tls=true: do not verify the server certificate
//	client_name=                CLIENT SETNAME for every connection
//	dial_timeout=5s             connecting, handshake (HELLO, AUTH) included
//	prefix=locker               key prefix (no braces)
//	node_timeout=100ms          Redlock: bound of each call to one node
//	drift_factor=0.01           Redlock: clock drift allowance per unit of TTL, in (0, 0.5)
//	max_key_len=4096            longest key accepted, in bytes
//	token_retention=10m         how long a fencing-token counter outlives its lock
//	fair=true                   queue waiters on the server in arrival order (see Fairness); false: barging
//	queue_ttl=3s                how long a queued waiter's entry outlives its last renewal (at least 30ms)
//
// cluster=true together with sentinel_master is an error. drivers/redis's
// read_timeout, write_timeout and pool_size have no rueidis counterpart
// (rueidis pipelines on one connection per node; a call is bounded by its
// context) and are rejected as unknown.
//
// Open connects at once (rueidis dials eagerly) and fails with an error
// naming the address and the cause: "server unreachable", "authentication
// failed", "no Redis answer on this port (not a Redis server, or TLS
// mismatch?)", "no answer within dial_timeout". For single-node and Redlock
// URLs it runs ROLE and refuses a replica (an error wrapping
// driver.ErrInvalid), since a lock written to a replica is refused or lost;
// allow_replica=true skips that. cluster=true on a server without cluster
// mode is refused too. A Redlock URL opens when a quorum of its masters
// answers; the others are dialled again in the background when used.
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
// and allow_eviction (TestOpenRefusesEvictingServer). It reads CONFIG GET
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
// Redlock with a minority of nodes down (TestErrUnavailable, each mode with
// its servers killed).
//
// # Watching a held lock
//
// The Locker implements driver.HoldWatcher on a single server, a Cluster
// and a Sentinel master (Lockers from Open, and NewWithClientOption), over
// the same client-side-caching invalidations its waits use: each held key
// is read with a plain GET on the watch client, whose connections run
// CLIENT TRACKING ON OPTOUT (rueidis tracks on every node of a Cluster and
// re-enables tracking on every new connection); the server sends an
// invalidation when the key is deleted, expires, is evicted or is
// written, and the watch reads the key again (re-arming the tracking) and
// reports the grant lost only if the value no longer is the grant's
// "<token>:<owner>". The read is not DoCache: a cached value could predate
// the grant while its invalidation is still on the way. rueidis signals a
// lost connection with an empty invalidation, after which every watched
// key is read again.
//
// Not watched: Redlock (a grant is a quorum, so one node's change is not a
// loss; counting per-node invalidations is not built), and adopted
// clients (New, NewRedlock), whose invalidation hook belongs to their
// owner. WatchHold returns an error there and package locker relies on
// renewal alone.
//
// A lock's key deleted (DEL by another client, an operator), overwritten
// by another owner, or evicted closes the holder's Lost() (cause server)
// within 100ms of the change: asserted by TestHoldWatch (deleted,
// overwritten) and TestHoldWatchEviction; measured 0.1–4.2ms on loopback
// under -race over ten runs. A server that restarts empty, or a Sentinel
// failover that loses the grant, closes Lost() once the watch has
// reconnected and re-read the key: within 3s of the server being back,
// asserted by TestHoldWatchRestart and TestHoldWatchFailover (the measured
// gaps are in the README's failure table). Another owner may be granted
// the key before Lost() closes; fencing tokens cover that gap. The
// holder's own renewals, which change the key's TTL and so invalidate it,
// are re-read and raise no alarm (TestHoldWatch "own refreshes": about 10
// renewals and 5 refreshes).
//
// When the watch connection breaks, nothing is reported: a lost connection
// is not a lost lock. The watch reconnects, reads every watched key again
// (the server forgot what the old connection tracked), and reports a key
// found gone or changed then (TestHoldWatch "watch connection killed":
// every client connection killed, no alarm, then a deletion caught as
// before). Meanwhile renewal and the safe deadline still apply.
//
// Cost: acquire and release stay one EVALSHA each, with nothing added to
// their round trips. The watch adds one GET of the lock key on its own
// connection per grant (TestHoldWatchCost counts, from INFO commandstats,
// exactly 2 EVALSHA and at most 1.1 watch GETs per acquire+release;
// measured 1.00 in 40 runs with both cores busy, each grant of a new
// key), and by design one more per renewal, whose invalidation it re-reads (not counted by a
// test). A key granted again at once can take one more: the invalidation
// of the previous release's DEL may arrive after the new grant is watched,
// and is read rather than guessed stale (measured up to 1.2 GETs per
// grant with one key under load, CI).
//
// # Keys, round trips, tokens
//
// A key k is stored at "<prefix>:{k}" with the value "<token>:<owner>"; its
// fencing-token counter is "<prefix>:{k}:token", in the same Cluster slot
// (keys containing braces are hashed into the tag), so no script ever fails
// with CROSSSLOT. Acquire, Refresh, Release and Inspect are one EVALSHA each
// (rueidis runs EVALSHA and falls back to EVAL, which loads the script, on
// NOSCRIPT). Acquire is SET NX PX plus the token; a held key answers with
// the holder's PTTL (a *driver.HeldError), which package locker uses to
// wake exactly when a crashed holder's lock expires. Refresh compares the
// owner and PEXPIREs, never reviving an expired key. Release compares the
// owner, DELetes and PUBLISHes on the channel "<prefix>:{k}".
//
// Tokens are max(counter+1, server TIME in microseconds). They strictly
// increase per key across release, expiry and re-acquire; they keep
// increasing when the counter key is lost or the server restarts empty,
// provided the server's clock never steps back by more than token_retention;
// counters of idle keys expire after ttl + token_retention, so they do not
// pile up. Capabilities reports DurableTokens under that assumption.
//
// # Fairness
//
// Waiting Acquires queue on the server exactly as with drivers/redis (see
// its package documentation, Fairness; the queue, the scripts and the key
// layout are shared, and waiters of both drivers stand in one queue):
// single server, Cluster and Sentinel queue waiters in arrival order, a
// release wakes only the next one through its Locker's wake channel (a
// SUBSCRIBE on the script client, one per Locker), a waiter whose
// process is gone is skipped at once (single server, Sentinel), a cut-off
// one, or a dead one on a Cluster, holds the queue up for at most
// queue_ttl (TestFair), Redlock and
// fair=false barge. The client-side-caching waits below serve barging
// waiters and driver.Waiter.
//
// # Waiting: client-side caching
//
// Locker implements driver.Waiter with client-side-caching invalidations of
// the lock key, as rueidislock does. Open builds two clients per
// deployment: one runs the scripts without client-side caching (rueidis
// then takes its faster synchronous path when a call has the connection to
// itself), the other has CLIENT TRACKING ON OPTOUT and the invalidation
// hook. A watched key is read on the tracking connection, so the server
// pushes an invalidation the moment the key is deleted, expires (when the
// server actually expires it: on access or in its active expiry cycle) or
// is overwritten; the push wakes the waiters. Tracking is one-shot: while a
// key has waiters, the next acquire attempt on it (which package locker
// makes right after a wake-up) runs on the tracking connection, and the
// script's own read re-arms the watch in the same round trip; if no attempt
// comes within 20ms, the watch re-arms with a read of its own, and wakes
// the waiters if the key is free by then. Every local waiter of one key
// shares one watch (a rediscore.Hub), so a release costs each process one
// push and about one acquire attempt, however many of its goroutines wait.
// A lost connection wakes every waiter, and the watches re-arm on the new
// connection.
//
// A Locker from New or NewRedlock cannot set the hook of a client it did
// not build (rueidis fixes it at construction), so it waits on pub/sub
// instead: one SUBSCRIBE per key, shared by its waiters, woken by the
// release script's PUBLISH; an expiry is then noticed through the PTTL
// returned by Acquire.
//
// # Redlock
//
// With several hosts the driver runs rediscore.Redlock: each call goes to
// every master in parallel, each bounded by node_timeout; a grant needs
// N/2+1 masters and is valid only if ttl − elapsed − (ttl×drift_factor +
// 2ms) > 0; a failed attempt is released on every master (also those that
// did not answer) and retried after the holders' expiry or a random delay;
// Refresh counts only when a quorum refreshed. Tokens are the maximum of the
// quorum's tokens, written back to the quorum before Acquire returns (a
// second round trip), so any later grant, whose quorum intersects this one,
// gets a larger token as long as no master of the intersection lost its
// data or the clocks agree. The minimum TTL is 3 × node_timeout. Each master
// gets one client, with tracking, which also runs the scripts (a timed-out
// call on rueidis's synchronous path closes its connection, and Redlock's
// short node_timeout would make those redials cascade on a loaded host);
// waits arm a watch on every master that answers.
//
// When to use Redlock: to keep locking available while a minority of Redis
// masters is down, when the protected work tolerates the rare double grant.
// When not to: Kleppmann's critique ("How to do distributed locking", 2016)
// holds — Redlock's safety rests on bounded network delay, bounded process
// pauses and bounded clock drift; a GC pause or a clock jump longer than the
// validity lets two clients believe they hold the lock. No lock service
// fixes that alone; fencing does: pass Lock.Token() to the protected
// resource and have it reject a token lower than one it has already seen.
//
// # Limits
//
//   - A single server or Sentinel master is a single point of truth: with
//     asynchronous replication a failover can lose a granted lock (the new
//     master never saw it), so two holders may coexist until the first
//     one's renewal fails. Fencing tokens still increase (TIME floor).
//   - TTLs are kept in milliseconds; the minimum is 10ms (Redlock: 3 ×
//     node_timeout). Keys are at most max_key_len bytes (default 4096).
//   - Client-side caching needs RESP3 (Redis 6 or later); the scripts need
//     Redis 5 or later. Tested with Redis 7.0.
//   - Each watched key stays in the server's tracking table until it next
//     changes, and in the client-side cache for at most 10 minutes.
//   - Scripts are not retried by rueidis (a retried release could report
//     ErrNotHeld for a lock it did free); package locker retries what is
//     safe. After a server restart the first call on the script client's
//     connection may fail once (EOF) before rueidis redials.
//   - An expiry wakes client-side-caching waiters only when the server
//     deletes the key (active expiry samples keys about ten times a
//     second); package locker's wake-up at the holder's PTTL bounds that.
package rueidis
