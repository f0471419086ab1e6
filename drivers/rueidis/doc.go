// Package rueidis is the locker driver for Redis on github.com/redis/rueidis:
// a single server, a Redis Cluster, a Sentinel-managed master, or Redlock over
// several independent masters. It registers the URL scheme "rueidis", so a
// blank import is all a program needs:
//
//	import _ "github.com/go-locker/locker/drivers/rueidis"
//
//	l, err := locker.OpenURL("rueidis://:password@127.0.0.1:6379/0")
//
// It is a thin adapter over the same internal core as drivers/redis: the
// semantics, the Lua scripts, the key layout, the fencing tokens, the fair
// queue, eviction and replica checks, the unavailable errors, the hold
// watch and Redlock are those documented in package
// github.com/go-locker/locker/drivers/redis, and a lock taken through one
// driver blocks the other (their waiters stand in one queue). This page
// lists only where the rueidis driver differs.
//
// # Constructors
//
// As in drivers/redis, Open builds everything from a URL and New and
// NewRedlock adopt clients the program already has (here rueidis.Client);
// NewWithClientOption builds the clients from a rueidis.ClientOption:
//
//	d, err := rueidis.Open(ctx, "rueidis://127.0.0.1:6379")
//	d, err := rueidis.New(ctx, client, nil)
//	d, err := rueidis.NewRedlock(ctx, clients, &rueidis.Options{NodeTimeout: 50 * time.Millisecond})
//
// Options has the fields of drivers/redis's Options, with the same defaults.
//
// # URL
//
//	rueidis://[[username]:password@]host[:port][,host[:port]...][/db][?param=value&...]
//
// The host list and the parameters are those of drivers/redis, with these
// differences (an unknown parameter is an error wrapping driver.ErrInvalid):
//
//	tls=false                   connect with TLS (the "rediss" scheme of drivers/redis)
//	insecure_skip_verify=false  with tls=true: do not verify the server certificate
//	dial_timeout=5s             connecting, handshake (HELLO, AUTH) included
//
// read_timeout, write_timeout and pool_size have no rueidis counterpart
// (rueidis pipelines on one connection per node; a call is bounded by its
// context) and are rejected as unknown. IPv6 literals are written in
// brackets ([::1]:6379).
//
// Open connects at once (rueidis dials eagerly), within its context, and
// fails with an error naming the address and the cause: "server
// unreachable", "authentication failed", "no Redis answer on this port
// (not a Redis server, or TLS mismatch?)", "no answer within
// dial_timeout". cluster=true on a server
// without cluster mode is refused. A Redlock URL opens when a quorum of its
// masters answers; the others are dialled again in the background when
// used.
//
// # Waiting: client-side caching
//
// Barging waiters (fair=false, Redlock) and driver.Waiter use client-side
// caching invalidations of the lock key, as rueidislock does, instead of
// pub/sub. Open builds two clients per deployment: one runs the scripts
// without client-side caching (rueidis then takes its faster synchronous
// path when a call has the connection to itself), the other has CLIENT
// TRACKING ON OPTOUT and the invalidation hook. A watched key is read on
// the tracking connection, so the server pushes an invalidation the moment
// the key is deleted, expires (when the server actually expires it: on
// access or in its active expiry cycle) or is overwritten; the push wakes
// the waiters. Tracking is one-shot: while a key has waiters, the next
// acquire attempt on it (which package locker makes right after a wake-up)
// runs on the tracking connection, and the script's own read re-arms the
// watch in the same round trip; if no attempt comes within 20ms, the watch
// re-arms with a read of its own, and wakes the waiters if the key is free
// by then. Every local waiter of one key shares one watch, so a release
// costs each process one push and about one acquire attempt, however many
// of its goroutines wait. A lost connection wakes every waiter, and the
// watches re-arm on the new connection. The fair queue's wake channel is a
// SUBSCRIBE on the script client, one per Locker.
//
// A Locker from New or NewRedlock cannot set the hook of a client it did
// not build (rueidis fixes it at construction), so it waits on pub/sub
// instead, as drivers/redis does.
//
// # Watching a held lock
//
// The hold watch (driver.HoldWatcher; Lockers from Open and
// NewWithClientOption, on a single server, a Cluster and a Sentinel
// master) uses the same invalidations as the waits: each held key is read
// with a plain GET on the tracking client (rueidis tracks on every node of
// a Cluster and re-enables tracking on every new connection). The read is
// not DoCache: a cached value could predate the grant while its
// invalidation is still on the way. rueidis signals a lost connection with
// an empty invalidation, after which every watched key is read again.
// Adopted clients are not watched: their invalidation hook belongs to
// their owner.
//
// On a Locker from Open (a single server, a Cluster or a Sentinel master,
// unless allow_eviction=true), the tracking client has one connection (per
// node) with CLIENT TRACKING ON OPTOUT NOLOOP, and the holder's refreshes,
// one by one and batched, run there too, with a script that reads the key
// again after its PEXPIRE: the key stays tracked, the server sends this
// process no invalidation for its own refresh, and the hold watch reads
// nothing after it. A refresh is then one EVALSHA and no other command.
// What NOLOOP keeps back the scripts' replies tell instead: a refresh that
// finds the key gone, or shortens its TTL, wakes this process's waiters of
// the key and has its hold watch read the key again. NOLOOP would also keep
// back the invalidation of a key evicted to make room for one of this
// connection's commands, which is why it needs maxmemory-policy noeviction
// (what Open checks by default). Redlock, NewWithClientOption and
// allow_eviction=true keep the refreshes on the script client, and the hold
// watch reads each key again after them.
//
// # Shared holds
//
// Semaphores and read-write locks (driver.SharedLocker) work as in
// drivers/redis, on the same keys and scripts: holds and waiters of both
// drivers share one lock. Waiters are woken on the fair queue's wake
// channel (pub/sub), as mutex waiters are. Redlock refuses them before any
// I/O (Locker.SharedUnsupported).
//
// # Redlock
//
// Each master gets one client, with tracking, which also runs the scripts
// (a timed-out call on rueidis's synchronous path closes its connection,
// and Redlock's short node_timeout would make those redials cascade on a
// loaded host); waits arm a watch on every master that answers.
//
// # Limits
//
// Those of drivers/redis, and:
//
//   - Client-side caching needs RESP3 (Redis 6 or later); the scripts need
//     Redis 5 or later.
//   - Each watched key stays in the server's tracking table until it next
//     changes, and in the client-side cache for at most 10 minutes.
//   - rueidis does not retry scripts. After a server restart it hands the
//     error of the dead connection (EOF, a reset) to the first command sent
//     on it, and then redials: the driver runs that call once more, on the
//     new connection, as the command never reached a live server. Where a
//     server ran a release and then closed the connection, the second run
//     reports ErrNotHeld for a lock the first did free.
//   - An expiry wakes client-side-caching waiters only when the server
//     deletes the key (active expiry samples keys about ten times a
//     second); package locker's wake-up at the holder's PTTL bounds that.
package rueidis
