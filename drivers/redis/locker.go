package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

func init() {
	locker.Register("redis", Driver{})
	locker.Register("rediss", Driver{})
}

// Driver opens Lockers from redis:// and rediss:// URLs. It is registered
// under both schemes, so locker.OpenURL("redis://host:6379") works after a
// blank import of this package.
type Driver struct{}

// Open implements driver.Driver; it is Open(dsn).
func (Driver) Open(dsn string) (driver.Locker, error) { return rediscore.Opened(Open(dsn)) }

// Options are the driver options shared with drivers/rueidis (the URL
// parameters prefix, node_timeout, drift_factor, max_key_len,
// token_retention). The zero value of every field means its default:
// Prefix "locker", NodeTimeout 100ms, DriftFactor 0.01, MaxKeyLen 4096
// bytes, TokenRetention 10m.
type Options = rediscore.Options

// core is the Locker both Redis drivers share; the alias keeps the
// embedded field unexported.
type core = rediscore.Locker

// Locker is a driver.Locker on Redis through go-redis: a single node, a
// Cluster or a Sentinel-managed master (one round trip per call), or Redlock
// over several independent masters. It is safe for concurrent use. Its
// methods:
//
//   - Acquire(ctx, key, owner, ttl) (driver.Locker): one round trip (a
//     script doing SET NX PX and minting the fencing token); Redlock runs it
//     on every master (see the package documentation). When another owner
//     holds key it returns a *driver.HeldError with the holder's remaining
//     TTL. An empty or oversized key (max_key_len, default 4096 bytes), an
//     empty owner or a non-positive ttl wrap driver.ErrInvalid; after Close,
//     driver.ErrClosed; a done ctx, ctx.Err() wrapped.
//   - AcquireWait(ctx, key, owner, ttl) (driver.BlockingAcquirer): waits
//     until key is granted to owner; on a single server, Cluster or
//     Sentinel in a queue on the server, in arrival order (see the package
//     documentation, Fairness); with fair=false and under Redlock by
//     barging. ctx bounds the wait; its end leaves nothing held or queued.
//     Errors as for Acquire, but never a *driver.HeldError.
//   - Refresh(ctx, key, owner, ttl) (driver.Locker): driver.ErrNotHeld if
//     owner does not hold key; an expired lock is never revived.
//   - Release(ctx, key, owner) (driver.Locker): driver.ErrNotHeld if owner
//     does not hold key. A release publishes on the key's channel, waking
//     waiters.
//   - Inspect(ctx, key) (driver.Inspector): holder, token and remaining
//     TTL; driver.ErrNotHeld if key is free.
//   - Capabilities() (driver.Capable): MinTTL 10ms (Redlock: 3 ×
//     node_timeout), millisecond granularity, tokens that survive a restart
//     of the server (floored at its clock; see the package documentation).
//   - Ping(ctx) (driver.Pinger): one round trip (Redlock: a quorum must
//     answer).
//   - Subscribe(ctx, key) (driver.Waiter): pub/sub on the channel the
//     release script publishes to. From its return, wake receives a value
//     whenever key's lock is released (and after a lost connection is
//     re-established). All waits of this Locker share one pub/sub
//     connection per server, and all waiters of one key one SUBSCRIBE.
//     Under Redlock, Subscribe returns once a quorum of nodes confirmed the
//     subscription (a release runs on a quorum, so one of them publishes),
//     each node given node_timeout to confirm; failing that, an error
//     naming the counts (TestRedlockSubscribe). Errors: driver.ErrInvalid
//     for a bad key, driver.ErrClosed after Close, ctx.Err() wrapped once
//     ctx is done.
//   - WatchHold(key, owner, token, lost) (driver.HoldWatcher), over
//     server-assisted client-side tracking (see the package documentation,
//     "Watching a held lock"): lost is called when key is deleted, evicted, expires or is overwritten by
//     another grant, never for the Locker's own refreshes and release.
//     Supported on Lockers from Open on a single server or a Sentinel
//     master; other Lockers (Cluster, Redlock, adopted clients) return an
//     error and their locks are watched by renewal alone. Errors:
//     driver.ErrClosed after Close.
//   - Close(): ends every wait (waiters are woken once) and closes the
//     clients if Open created them. It is idempotent; later calls of every
//     method return driver.ErrClosed.
//
// Every error starts with "redis: ".
type Locker struct{ *core }

// Locker implements driver.Locker, Waiter, Inspector, Capable, Pinger,
// HoldWatcher and BlockingAcquirer.
var _ rediscore.Interfaces = (*Locker)(nil)

// Open parses a redis:// or rediss:// URL (see the package documentation),
// builds the go-redis client(s) and checks them with one round trip each,
// bounded by dial_timeout + read_timeout: the server must be reachable,
// accept the credentials, speak Redis and — for single-node and Redlock
// URLs — be a master (a replica is refused unless allow_replica=true).
// It also refuses a server whose maxmemory-policy can evict lock keys
// unless allow_eviction=true (see the package documentation, Eviction).
// Errors: a malformed URL or an unknown parameter wraps driver.ErrInvalid;
// a failed check names the address and the cause, and wraps
// driver.ErrUnavailable when the servers could not be reached (refused,
// unreachable, TLS or authentication failure, a Redlock without a quorum
// answering). The Locker owns its clients and closes them on Close.
func Open(dsn string) (*Locker, error) {
	c, err := parseURL(dsn)
	if err != nil {
		return nil, err
	}
	var (
		clients []redis.UniversalClient
		tr      *tracker
	)
	if c.Mode() == "redlock" {
		for _, a := range c.Addrs {
			clients = append(clients, redis.NewClient(c.nodeOptions(a)))
		}
	} else {
		clients = []redis.UniversalClient{c.client()}
		switch c.Mode() {
		case "single", "sentinel":
			tr = newTracker(c.watchClient, c.Options.Prefix)
		case "cluster":
			cc := clients[0].(*redis.ClusterClient)
			tr = newRoutedTracker(c.watchClientAt, func(ctx context.Context, lock string) (string, error) {
				n, err := cc.MasterForKey(ctx, lock)
				if err != nil {
					return "", err
				}
				return n.Options().Addr, nil
			}, c.Options.Prefix)
		}
	}
	l := newLocker(clients, c.Options, true, tr)
	ctx, cancel := context.WithTimeout(context.Background(), c.DialTimeout+c.readTimeout)
	defer cancel()
	if err := check(ctx, c, clients); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

// New returns a Locker on a client the caller already has: a *redis.Client
// (single node), *redis.ClusterClient, or a failover (Sentinel) client. The
// Locker does not close client. opts (at most one) sets the key prefix,
// limits and token retention; zero fields take their defaults. New makes no
// round trip. Errors: a nil client or invalid options wrap driver.ErrInvalid.
//
// Configure the client with MaxRetries: -1 (go-redis retries a command
// whose reply was lost, and a retried release then reports ErrNotHeld for a
// lock it did free) and ContextTimeoutEnabled: true.
func New(client redis.UniversalClient, opts ...Options) (*Locker, error) {
	clients := []redis.UniversalClient{client}
	o, err := rediscore.Adopted("redis", false, clients, opts)
	if err != nil {
		return nil, err
	}
	return newLocker(clients, o, false, nil), nil
}

// NewRedlock returns a Locker running Redlock over clients, one per
// independent master (at least 2; use 3 or more so that a node may fail).
// The Locker does not close the clients. Errors: fewer than 2 clients, a
// nil client, or invalid options wrap driver.ErrInvalid.
func NewRedlock(clients []redis.UniversalClient, opts ...Options) (*Locker, error) {
	o, err := rediscore.Adopted("redis", true, clients, opts)
	if err != nil {
		return nil, err
	}
	return newLocker(clients, o, false, nil), nil
}

// newLocker builds a Locker over clients: one deployment, or the masters
// of a Redlock. owns: Close closes the clients. tr, if not nil, watches
// holds.
func newLocker(clients []redis.UniversalClient, o Options, owns bool, tr *tracker) *Locker {
	conns := make([]rediscore.Conn, len(clients))
	w := &waiter{subs: make([]*subscriber, len(clients)), quorum: 1, tracker: tr}
	for i, c := range clients {
		conns[i] = &conn{c: c, owns: owns}
		w.subs[i] = newSubscriber(c)
	}
	if len(clients) > 1 {
		w.quorum = len(clients)/2 + 1
		w.nodeTimeout = o.WithDefaults().NodeTimeout
	}
	cfg := rediscore.LockerConfig{
		Name: "redis", Conns: conns, Options: o, Waiter: w,
		HoldNeeds: "a Locker from Open on a single server, a Cluster or a Sentinel master",
	}
	if tr != nil {
		cfg.Hold = tr.hold
	}
	if len(clients) == 1 {
		cfg.Listener = w.subs[0] // the fair queue's wake-ups
		_, cfg.Sharded = clients[0].(*redis.ClusterClient)
	}
	return &Locker{rediscore.NewLocker(cfg)}
}

// check is Open's start-up check (see Open) of its clients.
func check(ctx context.Context, c *config, clients []redis.UniversalClient) error {
	if c.Mode() == "cluster" || c.Mode() == "sentinel" {
		cl := clients[0]
		if err := cl.Ping(ctx).Err(); err != nil {
			return fmt.Errorf("redis: %s at %s: %w", c.Mode(), strings.Join(c.Addrs, ","), explain(err))
		}
		if cc, ok := cl.(*redis.ClusterClient); ok {
			// Every node, replicas included: a replica is promoted on a
			// failover with the policy it has.
			return cc.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error {
				return rediscore.CheckEviction(ctx, "redis", n.Options().Addr, c.AllowEviction, doFunc(n))
			})
		}
		return rediscore.CheckEviction(ctx, "redis", "sentinel master "+c.SentinelMaster, c.AllowEviction, doFunc(cl))
	}
	node := func(i int) error {
		do := doFunc(clients[i])
		if err := rediscore.CheckMaster(ctx, "redis", c.Addrs[i], c.AllowReplica, do.Explain(explain)); err != nil {
			return err
		}
		return rediscore.CheckEviction(ctx, "redis", c.Addrs[i], c.AllowEviction, do)
	}
	if len(clients) == 1 {
		return node(0)
	}
	// A replica or an evicting server is always refused. Redlock tolerates
	// unreachable nodes as long as a quorum answered: it is built to run
	// with some nodes down.
	return rediscore.CheckQuorum("redis", len(clients), node, nil)
}

// explain turns a go-redis connection error into a message naming the
// cause; every such error also wraps driver.ErrUnavailable.
func explain(err error) error {
	return rediscore.AsUnavailable(explainCause(err))
}

func explainCause(err error) error {
	s := err.Error()
	switch {
	case strings.Contains(s, "WRONGPASS"), strings.Contains(s, "NOAUTH"), strings.Contains(s, "invalid password"),
		strings.Contains(s, "invalid username-password"):
		return fmt.Errorf("authentication failed (wrong username or password): %w", err)
	case strings.Contains(s, "connection refused"), strings.Contains(s, "no such host"), strings.Contains(s, "i/o timeout"),
		errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("server unreachable: %w", err)
	case strings.Contains(s, "x509:"), strings.Contains(s, "tls:"):
		return fmt.Errorf("TLS handshake failed (is the server certificate trusted? insecure_skip_verify=true skips the check): %w", err)
	case strings.Contains(s, "invalid reply"), strings.Contains(s, "can't parse"), strings.Contains(s, "unknown reply"),
		strings.Contains(s, "EOF"), strings.Contains(s, "connection reset"):
		return fmt.Errorf("no valid Redis reply (is this a Redis server? a TLS-only one needs rediss://): %w", err)
	}
	return err
}
