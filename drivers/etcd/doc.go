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
// "l" and "w", the names of the driver's own key spaces, so no key under one
// prefix is a key under another; a trailing "/" is ignored. A lock on key K is the etcd key prefix+"/l/"+K;
// processes waiting for K queue under prefix+"/w/"+len(K)+":"+K+"/".
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
// Release deletes the key in a transaction that compares its value with the
// owner and, when this Locker granted the lock, its create revision with the
// token granted, so that a stale release cannot delete a later incarnation
// (etcd issue 22082).
//
// Waiting (driver.Waiter) uses a queue, as etcd's concurrency.Mutex does:
// each waiting Locker puts an entry under the key's wait prefix with a
// session lease (5s, kept alive while the Locker is open); the first entry
// watches the lock key, every other entry watches the entry before it. A
// release wakes one process, which tries Acquire; when it leaves the queue,
// its successor is woken to watch the lock key. The server sees a constant
// number of requests per handoff, however many processes wait; there is no
// polling. The queue only chooses whom to wake: the lock is granted by
// Acquire's transaction alone, with the waiter's own live lease, so a waiter
// whose lease expired while it waited is never told it holds the lock.
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
//   - Without a lost connection, a waiter that is not first in the queue is
//     woken only when it becomes first; package locker's fallback timer
//     (2s) still retries. A waiting process keeps its place in the queue
//     while it has local waiters for the key, so processes are served in
//     queue order but a process may take the lock several times in a row.
//   - Release cannot tell two grants to the same owner apart when this
//     Locker granted both: the driver contract identifies a holder by its
//     owner string (package locker uses a new random owner per lock).
//   - Tokens are revisions: a cluster rebuilt from empty data (not restored
//     from a snapshot) starts them over.
//   - The first Acquire on a Locker, and one after the spare leases ran
//     out, costs one more request (a lease grant).
package etcd
