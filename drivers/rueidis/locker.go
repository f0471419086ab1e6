package rueidis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

// Scheme is the URL scheme the driver registers under: "rueidis".
const Scheme = "rueidis"

func init() { locker.Register(Scheme, Driver{}) }

// Driver opens Lockers from rueidis:// URLs. It is registered under Scheme,
// so locker.OpenURL("rueidis://host:6379") works after a blank import of
// this package.
type Driver struct{}

// Open implements driver.Driver; it is Open(dsn).
func (Driver) Open(dsn string) (driver.Locker, error) { return rediscore.Opened(Open(dsn)) }

// Options are the driver options shared with drivers/redis (the same URL
// parameters: prefix, node_timeout, drift_factor, max_key_len,
// token_retention). The zero value of every field means its default:
// Prefix "locker", NodeTimeout 100ms, DriftFactor 0.01, MaxKeyLen 4096
// bytes, TokenRetention 10m.
type Options = rediscore.Options

// core is the Locker both Redis drivers share; the alias keeps the
// embedded field unexported.
type core = rediscore.Locker

// Locker is a driver.Locker on Redis through rueidis: a single node, a
// Cluster or a Sentinel-managed master (one round trip per call), or Redlock
// over several independent masters. It is safe for concurrent use. Its
// methods:
//
//   - Acquire(ctx, key, owner, ttl) (driver.Locker): one round trip (a
//     script doing SET NX PX and minting the fencing token) on a single
//     node, Cluster or Sentinel master; Redlock runs it on every master in
//     parallel. When another owner holds key it returns a *driver.HeldError
//     with the holder's remaining TTL. An empty or oversized key
//     (max_key_len, default 4096 bytes), an empty owner or a non-positive
//     ttl wrap driver.ErrInvalid; after Close, driver.ErrClosed; a done ctx,
//     ctx.Err() wrapped.
//   - AcquireWait(ctx, key, owner, ttl) (driver.BlockingAcquirer): waits
//     until key is granted to owner; on a single server, Cluster or
//     Sentinel in a queue on the server, in arrival order (see the package
//     documentation, Fairness); with fair=false and under Redlock by
//     barging. ctx bounds the wait; its end leaves nothing held or queued.
//     Errors as for Acquire, but never a *driver.HeldError.
//   - Refresh(ctx, key, owner, ttl) (driver.Locker): one round trip
//     (compare owner, then PEXPIRE). driver.ErrNotHeld if owner does not
//     hold key; an expired lock is never revived.
//   - Release(ctx, key, owner) (driver.Locker): one round trip (compare
//     owner, DEL, PUBLISH). The DEL invalidates the key in every client
//     tracking it, which wakes their waiters. driver.ErrNotHeld if owner
//     does not hold key.
//   - Inspect(ctx, key) (driver.Inspector): holder, token and remaining
//     TTL; driver.ErrNotHeld if key is free.
//   - Capabilities() (driver.Capable): MinTTL 10ms (Redlock: 3 ×
//     node_timeout), millisecond granularity, tokens that survive a server
//     restart (see the package documentation for the clock assumption).
//   - Ping(ctx) (driver.Pinger): one round trip to every server (Redlock: a
//     quorum must answer).
//   - Subscribe(ctx, key) (driver.Waiter): every local subscriber of one
//     key shares one server-side watch: a client-side-caching read of the
//     lock key (clients from Open and NewWithClientOption), or a SUBSCRIBE
//     to its channel (clients adopted with New). wake receives a value when
//     the key is released, expires or is overwritten, and once after a lost
//     connection. Errors: driver.ErrInvalid for a bad key, driver.ErrClosed
//     after Close, ctx.Err() wrapped when ctx is done, or the server's error.
//   - WatchHold(key, owner, token, lost) (driver.HoldWatcher), over
//     client-side-caching invalidations (see the package documentation,
//     "Watching a held lock"): lost is called when key is deleted, evicted,
//     expires or is overwritten by another grant, never for the Locker's
//     own refreshes and release. Supported on Lockers from Open (single
//     server, Cluster, Sentinel) and NewWithClientOption; Redlock and
//     adopted clients (New, NewRedlock) return an error, and their locks are
//     watched by renewal alone. Errors: driver.ErrClosed after Close.
//   - Close(): closes the clients the Locker owns (not an adopted one) and
//     ends every subscription. Locks still held are left to expire. It is
//     idempotent; later calls of the other methods return driver.ErrClosed.
//
// Every error starts with "rueidis: ".
type Locker struct {
	*core
	w rediscore.Waiter // a *cscWaiter or a *pubsubWaiter
}

// Locker implements driver.Locker, Waiter, Inspector, Capable, Pinger,
// HoldWatcher and BlockingAcquirer.
var _ rediscore.Interfaces = (*Locker)(nil)

// newLocker builds a Locker over conns (one deployment, or the masters of
// a Redlock) waiting on w; hold, if not nil, watches holds.
// One deployment gets a listener on its script client for the fair
// queue's wake-ups.
func newLocker(w rediscore.Waiter, hold *rediscore.HoldWatch, o Options, conns ...rediscore.Conn) *Locker {
	cfg := rediscore.LockerConfig{
		Name: Scheme, Conns: conns, Options: o, Waiter: w, Hold: hold,
		HoldNeeds: "a Locker from Open (not Redlock) or NewWithClientOption",
		// The waiter's re-arming reads fail at once on closed clients.
		WaiterAfterConns: true,
	}
	if c, ok := conns[0].(*conn); ok && len(conns) == 1 {
		cfg.Listener = newListener(c.client)
		cfg.Sharded = c.client.Mode() == rueidis.ClientModeCluster
	}
	return &Locker{w: w, core: rediscore.NewLocker(cfg)}
}

// Open connects to the servers a rueidis:// URL names (see the package
// documentation for the format) and returns a Locker that owns its clients.
// A malformed URL or an unknown query parameter returns an error wrapping
// driver.ErrInvalid before any I/O. Connection failures (unreachable server,
// wrong password, a port that does not speak Redis) return an error naming
// the address and the cause; a single-node or Redlock URL pointing at a
// replica, or cluster=true on a server without cluster mode, an error that
// also wraps driver.ErrInvalid. A failure to reach the servers (refused,
// unreachable, TLS or authentication failure, a Redlock without a quorum
// answering) wraps driver.ErrUnavailable. A server whose maxmemory-policy
// can evict lock keys is refused unless allow_eviction=true (see the
// package documentation, Eviction). A Redlock URL opens when a quorum of
// its masters answers (see the package documentation).
func Open(dsn string) (*Locker, error) {
	c, err := parseURL(dsn)
	if err != nil {
		return nil, err
	}
	w := newCSCWaiter()
	w.perNode = c.Options.NodeTimeout
	var all []rueidis.Client
	closeAll := func() {
		for _, cl := range all {
			cl.Close()
		}
	}
	// Each deployment gets two clients: one runs the scripts, without
	// client-side caching (so rueidis can use its faster synchronous path
	// when a call has the connection to itself), and one with tracking and
	// the invalidation hook, for waiting.
	pair := func(addrs []string, name string) (cmd, watch rueidis.Client, err error) {
		opt := c.clientOption(addrs, nil)
		opt.DisableCache = true
		if cmd, err = newClient(opt, name); err != nil {
			return nil, nil, err
		}
		all = append(all, cmd)
		if watch, err = newClient(c.clientOption(addrs, w), name); err != nil {
			return nil, nil, err
		}
		all = append(all, watch)
		return cmd, watch, nil
	}
	if c.redlock() {
		return openRedlock(c, w)
	}
	// The hook may run as soon as the watch client exists: the HoldWatch
	// is in place before, and reads through the client once it is set.
	var watchClient rueidis.Client
	w.hold = newHoldWatch(func() rueidis.Client { return watchClient }, c.Options.Prefix)
	addr := strings.Join(c.Addrs, ",")
	cmd, watch, err := pair(c.Addrs, addr)
	if err != nil {
		closeAll()
		return nil, err
	}
	if c.Cluster && cmd.Mode() != rueidis.ClientModeCluster {
		closeAll()
		return nil, fmt.Errorf("rueidis: %s: cluster=true but the server is not a Redis Cluster (cluster mode disabled): %w", addr, driver.ErrInvalid)
	}
	if !c.Cluster && c.SentinelMaster == "" {
		if err := checkMaster(cmd, addr, c); err != nil {
			closeAll()
			return nil, err
		}
	}
	if err := checkEviction(cmd, addr, c); err != nil {
		closeAll()
		return nil, err
	}
	w.clients = []rueidis.Client{watch}
	w.piggyback = !c.Cluster
	watchClient = watch
	return newLocker(w, w.hold, c.Options, &conn{client: cmd, addr: addr, owned: all, watch: watch, w: w}), nil
}

// New returns a Locker on a client the caller already has (single node,
// Cluster or Sentinel). The Locker does not close client, and New makes no
// round trip. Since rueidis fixes a client's invalidation hook when the
// client is built, an adopted client waits on the key's pub/sub channel
// (the release script publishes on it) instead of on client-side-caching
// invalidations; expiries are covered by package locker's wake-up at the
// holder's remaining TTL. Use NewWithClientOption to get invalidation-based
// waits with your own client settings. opts (at most one) sets the key
// prefix, limits and token retention; zero fields take their defaults.
// Errors: a nil client or invalid options wrap driver.ErrInvalid.
func New(client rueidis.Client, opts ...Options) (*Locker, error) {
	clients := []rueidis.Client{client}
	o, err := rediscore.Adopted(Scheme, false, clients, opts)
	if err != nil {
		return nil, err
	}
	addr := strings.Join(addrsOf(client), ",")
	return newLocker(newPubSubWaiter(clients, o.NodeTimeout), nil, o, &conn{client: client, addr: addr}), nil
}

// NewRedlock returns a Locker running Redlock over clients, one per
// independent master (at least 2; use 3 or more so that a node may fail).
// The Locker does not close the clients; it waits on pub/sub, as New does.
// Errors: fewer than 2 clients, a nil client, or invalid options wrap
// driver.ErrInvalid.
func NewRedlock(clients []rueidis.Client, opts ...Options) (*Locker, error) {
	o, err := rediscore.Adopted(Scheme, true, clients, opts)
	if err != nil {
		return nil, err
	}
	conns := make([]rediscore.Conn, len(clients))
	for i, c := range clients {
		conns[i] = &conn{client: c, addr: strings.Join(addrsOf(c), ",")}
	}
	return newLocker(newPubSubWaiter(slices.Clone(clients), o.NodeTimeout), nil, o, conns...), nil
}

// NewWithClientOption builds two rueidis clients from opt, as Open does: one
// that runs the scripts (with DisableCache), and one for waiting, with
// CLIENT TRACKING ON OPTOUT (opt.ClientTrackingOptions is replaced) and its
// OnInvalidations hook chained to the Locker's (a hook already in opt is
// still called). The Locker owns both and waits on invalidations. It makes no ROLE check.
// opt.DisableCache must be false; opts is as for New. Errors: those of
// rueidis.NewClient (naming the cause), or driver.ErrInvalid for bad
// options.
func NewWithClientOption(opt rueidis.ClientOption, opts ...Options) (*Locker, error) {
	o, err := rediscore.OneOptions(Scheme, opts)
	if err != nil {
		return nil, err
	}
	if opt.DisableCache {
		return nil, fmt.Errorf("rueidis: NewWithClientOption needs client-side caching (DisableCache=false): %w", driver.ErrInvalid)
	}
	w := newCSCWaiter()
	w.perNode = o.NodeTimeout
	addr := strings.Join(opt.InitAddress, ",")
	cmdOpt := opt
	cmdOpt.DisableCache, cmdOpt.OnInvalidations = true, nil
	cmd, err := newClient(cmdOpt, addr)
	if err != nil {
		return nil, err
	}
	if prev := opt.OnInvalidations; prev != nil {
		opt.OnInvalidations = func(m []rueidis.RedisMessage) { w.onInvalidations(m); prev(m) }
	} else {
		opt.OnInvalidations = w.onInvalidations
	}
	opt.ClientTrackingOptions = trackingOptions
	var watchClient rueidis.Client
	w.hold = newHoldWatch(func() rueidis.Client { return watchClient }, o.Prefix)
	watch, err := newClient(opt, addr)
	if err != nil {
		cmd.Close()
		return nil, err
	}
	w.clients = []rueidis.Client{watch}
	w.piggyback = watch.Mode() != rueidis.ClientModeCluster
	watchClient = watch
	all := []rueidis.Client{cmd, watch}
	return newLocker(w, w.hold, o, &conn{client: cmd, addr: addr, owned: all, watch: watch, w: w}), nil
}

func addrsOf(c rueidis.Client) []string {
	var out []string
	for a := range c.Nodes() {
		out = append(out, a)
	}
	return out
}

// trackingOptions makes the watch clients' connections track every key they
// read (OPTOUT), as rueidislock does: an acquire attempt's read inside the
// script arms the watch without an extra CLIENT CACHING YES.
var trackingOptions = []string{"OPTOUT"}

// clientOption returns the rueidis options for addrs; w, if not nil, gets
// the invalidations.
func (c *config) clientOption(addrs []string, w *cscWaiter) rueidis.ClientOption {
	opt := rueidis.ClientOption{
		InitAddress:       addrs,
		Username:          c.Username,
		Password:          c.Password,
		SelectDB:          c.DB,
		ClientName:        c.ClientName,
		TLSConfig:         c.tlsConfig(addrs[0]),
		Dialer:            net.Dialer{Timeout: c.DialTimeout},
		ForceSingleClient: !c.Cluster && c.SentinelMaster == "",
	}
	if w != nil {
		opt.OnInvalidations = w.onInvalidations
		opt.ClientTrackingOptions = trackingOptions
	}
	if c.SentinelMaster != "" {
		opt.Sentinel = rueidis.SentinelOption{
			MasterSet: c.SentinelMaster,
			Username:  c.SentinelUsername,
			Password:  c.SentinelPassword,
			Dialer:    net.Dialer{Timeout: c.DialTimeout},
			TLSConfig: c.tlsConfig(addrs[0]),
		}
	}
	return opt
}

// newClient builds a client and names the cause when it cannot connect.
func newClient(opt rueidis.ClientOption, addr string) (rueidis.Client, error) {
	cl, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, rediscore.AsUnavailable(fmt.Errorf("rueidis: connect to %s: %w", addr, describe(err)))
	}
	return cl, nil
}

// errAuth marks a rejected or missing password.
var errAuth = errors.New("authentication failed (missing or wrong username or password)")

// describe turns a handshake failure into an error that names its cause.
func describe(err error) error {
	var re *rueidis.RedisError
	msg := err.Error()
	switch {
	case errors.As(err, &re) && (strings.HasPrefix(msg, "WRONGPASS") || strings.HasPrefix(msg, "NOAUTH")):
		return fmt.Errorf("%w: %w", errAuth, err)
	case errors.Is(err, rueidis.ErrNoAddr):
		return fmt.Errorf("no reachable server: %w", err)
	case strings.Contains(msg, "connection refused"):
		return fmt.Errorf("server unreachable: %w", err)
	case errors.As(err, &re):
		return err
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("no answer within dial_timeout (not a Redis server, or TLS mismatch?): %w", err)
	case strings.Contains(msg, "i/o timeout"), strings.Contains(msg, "EOF"),
		strings.Contains(msg, "unexpected"), strings.Contains(msg, "protocol"),
		strings.Contains(msg, "unknown message type"):
		return fmt.Errorf("no Redis answer on this port (not a Redis server, or TLS mismatch?): %w", err)
	}
	return err
}

// checkMaster refuses a single-node (or Redlock) address that is a replica
// (rediscore.CheckMaster); allow_replica=true turns the check off.
func checkMaster(cl rueidis.Client, addr string, c *config) error {
	if c.AllowReplica {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.DialTimeout)
	defer cancel()
	return rediscore.CheckMaster(ctx, Scheme, addr, false, doFunc(cl).Explain(describe))
}

// checkEviction refuses a deployment whose maxmemory-policy can evict lock
// keys unless allow_eviction=true (rediscore.CheckEviction): on a Cluster
// every node, replicas included (one is promoted on a failover with the
// policy it has); on Sentinel the master; else the one server.
func checkEviction(cl rueidis.Client, addr string, c *config) error {
	if c.AllowEviction {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.DialTimeout)
	defer cancel()
	if !c.Cluster {
		if c.SentinelMaster != "" {
			addr = "sentinel master " + c.SentinelMaster
		}
		return rediscore.CheckEviction(ctx, Scheme, addr, false, doFunc(cl))
	}
	nodes := cl.Nodes()
	addrs := make([]string, 0, len(nodes))
	for a := range nodes {
		addrs = append(addrs, a)
	}
	slices.Sort(addrs)
	for _, a := range addrs {
		if err := rediscore.CheckEviction(ctx, Scheme, a, false, doFunc(nodes[a])); err != nil {
			return err
		}
	}
	return nil
}
