// Package rediscore is the Redis locking logic shared by drivers/redis
// (go-redis) and drivers/rueidis: the Lua scripts, key naming, the
// single-deployment Node, the Redlock quorum logic, a subscription Hub and
// the URL format both drivers parse (ParseURL, Options), and Locker, the
// complete driver.Locker that both drivers' Lockers wrap, declaring their
// own methods (so go doc lists them) that call it. Each driver
// implements Conn for its client and a Waiter (and, where it can, feeds a
// HoldWatch), and is otherwise a thin adapter: URL to client. Every error
// of a Locker starts with its driver's name ("redis: ", "rueidis: ").
//
// # Keys and values
//
// A user key k maps to the lock key "<prefix>:{k}", the token counter
// "<prefix>:{k}:token" and the pub/sub channel "<prefix>:{k}" (see Keys; keys
// with braces are hashed into the tag). The hash tag keeps a lock and its
// counter in one Cluster slot, so no script ever fails with CROSSSLOT. The
// lock's value is "<token>:<owner>".
//
// # Round trips
//
// Acquire, Refresh, Release and Inspect are one EVALSHA each (EVAL on
// NOSCRIPT, which also loads the script). RefreshBatch is one EVALSHA of
// the refresh script per lock, in one pipeline (Conn.RunBatch). The hold
// watch's re-reads that fall due together go out as one pipeline of GETs
// (HoldWatch.SetBatchReader). Release publishes on the key's
// channel, which is what pub/sub waiters listen to; its DEL also triggers
// client-side-caching invalidations.
//
// # An acquire abandoned mid-call
//
// When the caller's ctx ends while an acquire is on the wire, the script
// runs on regardless and the caller returns at once. The reply is awaited in
// the background, and a grant the attempt created is deleted by its token
// (CleanupScript); AcquireScript reports whether it created the grant or
// found owner already holding it, so a lock owner held before the attempt
// (the same owner through another Locker: a WithOwner hand-over) is never
// freed. When the reply is lost too, nothing is deleted on a single
// deployment (the grant, if any, expires at its TTL); Redlock releases the
// unknown nodes by owner only when the other nodes prove owner did not hold
// a quorum before.
//
// # Fencing tokens
//
// token = max(counter+1, server TIME in microseconds), written back to the
// counter with PX = ttl + TokenRetention (default 10 minutes). The counter
// makes tokens strictly increasing even within one microsecond; the TIME
// floor keeps them increasing after the counter expired, was deleted, or the
// server restarted empty. Assumption: the server's clock (on Cluster or
// Sentinel, every master's that may serve the key) never steps back by more
// than TokenRetention. Counters of idle keys expire, so they do not pile up.
// Tokens are about 1.8e15 today and stay below 2^53 (exact in Lua numbers)
// until the year 2255.
//
// # Shared holds
//
// Semaphores and read-write locks (driver.SharedLocker, shared.go and
// shared_scripts.go) run on a Node; Redlock refuses them before any I/O
// (Locker.SharedUnsupported): each master would count its own holders, and
// independent majorities could admit different sets of n holders.
//
// The holders of one lock are a sorted set scored by each lease's end on
// server TIME, with a hash of their tokens and modes. Why: each holder
// needs a lease of its own (one key with PX, as the mutex has, can hold
// one lease), and scoring by server time keeps the leases on the one
// clock that decides expiry; every script drops the ended leases first
// (prune), so no background sweeper is needed and an expiry is acted on by
// whichever script touches the lock next. Tokens come from the mutex's
// counter, so they rise across the mutex, the semaphore and the read-write
// lock of a key, and a writer's token exceeds every earlier reader's. One
// script per operation keeps the limit check and the grant atomic and each
// call one round trip (TestShared/commands in both drivers). Every
// key of a lock (SharedKeys) shares the mutex's hash tag, for Cluster, and
// extends the lock key with ":sem" or ":rw", so the mutex, the semaphore
// and the read-write lock on one key never interfere.
//
// Waiters use the fair queue's wake channel and waiting loop (queue.go):
// a waiter's entry holds its mode, limit and TTL; a script that frees room
// (settle) grants the queue from its head as far as it fits, records each
// grant for its waiter to collect, and publishes on that waiter's wake
// channel. Granting inside the script, rather than waking waiters to race
// for it, is what makes a run of readers enter together and a writer at
// the head block later readers (writer preference), with O(1) commands per
// granted waiter. An entry whose Node no longer listens is dropped, as for
// the mutex.
//
// # Redlock
//
// See Redlock for the algorithm, its token scheme (quorum maximum written
// back to the quorum) and its limits.
//
// # Hub
//
// Hub shares one server subscription per channel among all local waiters
// of a process (see Hub).
package rediscore
