// Package etcd is the etcd v3 driver for package locker, on
// go.etcd.io/etcd/client/v3. It registers itself under the name "etcd", so
// a blank import is enough:
//
//	import _ "github.com/go-locker/locker/drivers/etcd"
//
//	l, err := locker.OpenURL("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/myapp")
//
// As every driver of this module (see docs/writing-a-driver.md), the
// package has two constructors: Open builds the client from a URL, and New
// adopts a *clientv3.Client the program already has (Close then leaves that
// client open, and New makes no request), with the settings of the URL's
// path and parameters that do not concern the connection in an Options
// (nil means the defaults: Prefix DefaultPrefix "/locker", MinTTL 2s,
// RequestTimeout 10s). Open gives up when its context is done:
//
//	d, err := etcd.Open(ctx, "etcd://10.0.0.1:2379/myapp")
//	d, err := etcd.New(ctx, client, &etcd.Options{Prefix: "/myapp"})
//	l := locker.New(d)
//
// # URL
//
//	etcd://[user:password@]host:port[,host:port…][/prefix][?param=value&…]
//
// The hosts are the endpoints of one etcd cluster (not independent servers:
// etcd replicates, so there is no Redlock-style quorum here). user and
// password enable etcd authentication; Open then authenticates at once,
// within dial_timeout. Otherwise Open makes no request: an unreachable
// cluster shows up as errors from the first calls.
//
// The path is the key prefix, so several applications can share a cluster:
// "/myapp" (the default is "/locker"). It is "/" followed by segments, each
// any non-empty bytes (keys and prefixes are opaque) other than ".", "..",
// "l", "w", "s" and "rw", the names of the driver's own key spaces, so no
// key under one prefix is a key under another; a trailing "/" is ignored.
// A lock on key K is the etcd key prefix+"/l/"+K; waiting Acquires of K
// queue under prefix+"/w/q/"+len(K)+":"+K+"/", subscribers (driver.Waiter)
// under prefix+"/w/"+len(K)+":"+K+"/". The semaphore on K lives under
// prefix+"/s/"+len(K)+":"+K+"/", the read-write lock on K under
// prefix+"/rw/"+len(K)+":"+K+"/" (see Semaphores and read-write locks).
//
// Query parameters (any other is an error wrapping driver.ErrInvalid, as is
// a parameter or an endpoint given twice, and tls=false with any of the TLS
// parameters):
//
//	dial_timeout=5s         bound on connecting (and authenticating)
//	request_timeout=10s     bound on each request (a sooner context deadline wins)
//	keepalive_time=10s      gRPC keepalive ping interval
//	keepalive_timeout=5s    how long an unanswered ping takes to drop the connection
//	auto_sync_interval=0    refresh the endpoint list from the cluster this often (0: never)
//	min_ttl=2s              shortest TTL accepted, whole seconds (see TTLs)
//	tls=false               use TLS (implied by any of the four below)
//	ca_file=                PEM file of CAs to verify the server (default: system roots)
//	cert_file=, key_file=   client certificate and key, together
//	server_name=            name to verify the server's certificate against
//	insecure_skip_verify=false  do not verify the server's certificate (testing only)
//
// # How it works
//
// Acquire is one transaction: if the lock key's create revision is 0 (the
// key does not exist), put the owner string with a lease of the TTL; else
// read the holder. The fencing token is the key's create revision: etcd's
// revision counter is global to the cluster and never goes back, so tokens
// strictly increase across release, expiry, re-acquire and restarts. The
// same owner acquiring again gets the same token and a renewed lease.
//
// Every lock has a lease of its own, so a lock nobody refreshes expires after
// its own TTL whatever the Locker's other locks do. Leases are not renewed in
// the background: Refresh (which package locker calls every TTL/3) sends one
// keepalive, so a lease never outlives what package locker believes. A lease
// freed by Release is kept and reused by a later Acquire with the same TTL,
// renewed by a keepalive sent in parallel with the Acquire's transaction;
// the lock is reported held only once that renewal is confirmed, so a lock
// is never granted on a lease that expired meanwhile. The uncontended path
// is thus one transaction to acquire (plus that keepalive, in parallel) and
// one to release, like a raw put and delete; a refresh is one read and one
// keepalive, and renewals travel on one long-lived keepalive stream per
// Locker.
//
// Many locks. The reads of Refreshes that fall due together go to the
// server as one linearizable read-only transaction of up to 128 gets
// (etcd's default --max-txn-ops; fewer when the server refuses that many),
// each Refresh getting the answer for its own key, and keepalives are
// written to the stream by a goroutine of their own, so that a write held
// up by gRPC flow control never stops the answers from being read. The
// many-locks test holds 500 locks with a 3s TTL by default and 10,000 with
// LOCKER_SCALE=1 (docs/testing.md, docs/benchmarks.md).
//
// Load. When the cluster's apply loop falls behind, etcd refuses writes
// with "etcdserver: too many requests" before proposing them. Acquire and
// Release then retry with a jittered backoff (10ms doubling to 500ms) while
// ctx lasts, for at most request_timeout, and then fail with an error
// wrapping driver.ErrUnavailable and ErrPushback. Renewals (reads and
// lease keepalives, which are not proposals) are not refused this way, and
// get priority: a Locker lets at most 16 Acquire attempts, and 16 Release
// attempts, be in flight at once (the rest wait for a turn, bounded by
// their context),
// so that a flood of them cannot fill the apply queue that every renewal's
// owner check waits behind. Load delays new acquires, not the locks
// already held. Keepalives go out on four streams per Locker, which the
// server serves in parallel. The server answers one stream's requests one
// after the other, so a renewal that gives up on an answer abandons its
// stream when the stream's oldest request has waited 300ms: later
// renewals go out on a new stream instead of queueing behind a stalled one.
//
// Release deletes the key in a transaction that compares its value with the
// owner and, when this Locker granted the lock, its create revision with the
// token granted, so that a stale release cannot delete a later incarnation
// (etcd issue 22082).
//
// Waiting (driver.BlockingAcquirer, which package locker's Acquire uses) is
// first come, first served, as with etcd's concurrency.Mutex. A waiting
// Acquire takes a free key in one transaction only while nobody queues for
// it; otherwise it puts an entry on a wait lease of its own (5s, renewed
// while it waits) under the key's mutex queue, and watches the entry before
// its own or, once first, the lock key. A release wakes one process, which
// is granted by a transaction that deletes its entry and puts the lock key
// on a fresh lease of the TTL asked, only if the entry still exists: a
// waiter whose entry expired while it waited queues again and is never told
// it holds the lock. A process that releases and asks again queues behind
// those already waiting. A one-shot Acquire (TryAcquire) does not look at
// the queue: it takes a free key even while others wait.
//
// Subscribe (driver.Waiter, for callers of the driver itself) uses a
// separate queue of watches: each subscribed Locker puts an entry under the
// key's wait prefix with a session lease (5s, kept alive while the Locker
// is open); the first entry watches the lock key, every other entry watches
// the entry before it. A release wakes one subscriber, which tries Acquire;
// when it leaves the queue, its successor is woken to watch the lock key.
//
// Both queues cost the server a constant number of requests per handoff,
// however many processes wait; there is no polling.
//
// Loss (driver.HoldWatcher): package locker watches every lock it holds.
// The driver watches the lock key from the grant's revision on, and Lost()
// closes when the key is deleted (by another client, or with its lease,
// revoked by an operator or expired on the server) or overwritten by
// another owner; the owner's own Refresh and idempotent Acquire keep the
// key's value and create revision, and a delete by this Locker's Release
// ends the watch silently: none raises an alarm. A Release by the same owner through another
// Locker (a WithOwner handover) is a loss for this one.
// Lost() closes within 50ms of the change for a lock held 200ms or more,
// and within 150ms right after the grant, when etcd's loop that catches up
// watches starting in the past (every 100ms) may deliver the first events.
// A waiter can be granted the key before the
// holder's Lost() closes (both follow the same delete by a few
// milliseconds): fencing tokens are the remedy. All of a Locker's watches
// share one gRPC watch stream. A watch the
// server cancels (compaction, a member without a leader) is replaced after
// a read of the key, which reports the loss if the grant is gone; while the cluster cannot be read, nothing is
// reported and renewal with its safe deadline ends the lock in time.
//
// Errors: a cluster that cannot serve a request is driver.ErrUnavailable:
// connections refused or unanswered (every call fails within
// request_timeout), no quorum, a failed TLS handshake, refused or missing
// credentials (Open fails with a wrong password, every call without one).
// A key held by someone else is driver.ErrNotAcquired,
// never ErrUnavailable. When the caller's context ends first, the error
// wraps ctx.Err() instead.
//
// # Semaphores and read-write locks
//
// The Locker implements driver.SharedLocker. A mutex, a semaphore and a
// read-write lock on the same key are three locks: each lives under its own
// key space ("/l/", "/s/", "/rw/"), and keys are length-prefixed, never
// split on a separator. Under a shared lock's base B:
//
//   - each holder is one key, B+"h/"+mode+"/"+owner (mode "p" for a permit,
//     "r" a read, "w" a write), on a lease of its own of the hold's TTL,
//     exactly as a mutex's lock key: the same spare leases, Refresh (one
//     read and one keepalive) and Release (a delete comparing owner and
//     create revision). The token is the holder key's create revision, so
//     a grant's token is above every earlier grant's, permit, read, write
//     or mutex, and survives restarts;
//   - each waiting request is one key under B+"q/", ordered by create
//     revision: a FIFO queue.
//
// A grant is one transaction that puts the holder key only if the compares
// on what it must respect still hold: for a read, no writer holds or waits;
// for a write, nobody holds or waits; for a permit, nobody waits and no
// holder key was created since the holders were counted, fewer than the
// request's limit (the count cannot have grown; a first attempt counts
// zero, so an uncontended permit, like a read or a write, is one
// transaction; a permit beside other holders costs one more, to count
// them). A refused one-shot request therefore writes nothing, and
// the limit is per call: callers with different limits never admit more
// holders than the largest. Owner-idempotent requests find the holder key
// in the same transaction and renew it; a read holder asking for the write
// lock (or the reverse) gets driver.ErrInvalid at once.
//
// A waiting request queues an entry on a wait lease of its own (5s, renewed
// by the wait; the put and the first read of the lock are one
// transaction), then watches only what it waits for: a read the latest
// earlier writer's entry, then the writer's holder key; a permit or a write
// the entry just before its own, then the holders. A release thus wakes the
// waiters it can let in, not every waiter, and a waiting writer keeps the
// reads that come after it out (writer preference; a one-shot read behind
// it gets driver.ErrNotAcquired). A waiter is granted by a transaction that
// also requires its own entry to exist at its create revision, and deletes
// it. A wait that ends without a grant revokes its wait lease (retrying
// until the cluster answers); nothing renews that lease any more, so the
// entry dies with it in any case, and a wait cancelled while the cluster is
// down cannot block the lock for good.
//
// Why not etcd's RWMutex recipe (client/v3/experimental/recipes): there a
// waiter takes the lock as soon as the key it watches is deleted, without
// checking that its own key still exists, so a waiter whose session lease
// expired while it waited believed it held the lock beside the next one
// (etcd #16221: two writers in). Here the wake-up only triggers a re-read;
// the grant is the transaction alone, on the waiter's live entry and the
// holders as they are, so an expired waiter queues again and is never told
// it holds anything. etcd has no semaphore (etcd #12490).
//
// A crashed holder's permit comes back when etcd deletes its key with its
// lease (see Limits). Costs and latencies, measured: docs/backends/etcd.md.
//
// # TTLs
//
// etcd leases have whole-second TTLs, and a server refuses leases shorter
// than 1.5 election timeouts (1.5s with the default 1s), silently raising
// them. The driver therefore reports, through driver.Capable, a minimum TTL
// of min_ttl (2s) and a granularity of one second, and rejects a shorter TTL
// with driver.ErrInvalid; package locker rounds TTLs up accordingly. If the
// server grants a longer lease than asked (its minimum is above min_ttl),
// Acquire fails with driver.ErrInvalid rather than hold a lock longer than
// its TTL: raise min_ttl.
//
// # Limits
//
//   - An expired lease's key is deleted by the leader's lease checker, which
//     runs every 500ms, so a crashed holder's lock is freed after its TTL and
//     within 0.6s of it; a leader change extends every lease by the
//     election timeout plus the TTL (etcd renews them on promotion), so a
//     crashed holder's lock can outlive its TTL during an election. Neither
//     ever shortens a lock.
//   - Inspect reports the remaining TTL in whole seconds, rounded down (1ms
//     when under a second), as etcd does, and costs two requests.
//   - A waiter that stopped (paused, cut off, killed) holds the queue up
//     until its wait lease lapses: 5s after its last renewal. A cancelled
//     or closed wait leaves the queue at once.
//   - Within one process, package locker queues its own waiters for a key
//     and only the first waits in the server; the next joins the server's
//     queue once the first is granted, behind the processes waiting then.
//   - Release cannot tell two grants to the same owner apart when this
//     Locker granted both: the driver contract identifies a holder by its
//     owner string (package locker uses a new random owner per lock).
//   - Tokens are revisions: a cluster rebuilt from empty data (not restored
//     from a snapshot) starts them over.
//   - The first Acquire on a Locker, and one after the spare leases ran
//     out, costs one more request (a lease grant).
package etcd
