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

// Open implements driver.Driver: Open(context.Background(), dsn).
func (Driver) Open(dsn string) (driver.Locker, error) {
	return rediscore.Opened(Open(context.Background(), dsn))
}

// Locker is a driver.Locker on Redis through go-redis: a single node, a
// Cluster or a Sentinel-managed master (one round trip per call), or Redlock
// over several independent masters. Besides driver.Locker it implements
// driver.BlockingAcquirer, driver.Waiter, driver.HoldWatcher,
// driver.Inspector, driver.Capable and driver.Pinger. It is safe for
// concurrent use. Every error it returns starts with "redis: ".
type Locker struct {
	core *rediscore.Locker
	tr   *tracker // the hold watch's, nil if none
}

var (
	_ driver.Locker           = (*Locker)(nil)
	_ driver.BlockingAcquirer = (*Locker)(nil)
	_ driver.Waiter           = (*Locker)(nil)
	_ driver.HoldWatcher      = (*Locker)(nil)
	_ driver.Inspector        = (*Locker)(nil)
	_ driver.Capable          = (*Locker)(nil)
	_ driver.Pinger           = (*Locker)(nil)
	_ driver.SharedLocker     = (*Locker)(nil)
	_ driver.SharedRefuser    = (*Locker)(nil)
)

// Open parses a redis:// or rediss:// URL (see the package documentation),
// builds the go-redis client(s) and checks them with one round trip each,
// bounded by ctx and by dial_timeout + read_timeout: the server must be
// reachable, accept the credentials, speak Redis and — for single-node and
// Redlock URLs — be a master (a replica is refused unless
// allow_replica=true). It also refuses a server whose maxmemory-policy can
// evict lock keys unless allow_eviction=true (see the package
// documentation, Eviction). ctx bounds Open only, not the Locker.
//
// Errors: a malformed URL or an unknown parameter wraps driver.ErrInvalid,
// before any I/O; a done ctx, ctx.Err() wrapped; a failed check names the
// address and the cause, and wraps driver.ErrUnavailable when the servers
// could not be reached (refused, unreachable, TLS or authentication
// failure, a Redlock without a quorum answering). The Locker owns its
// clients and closes them on Close.
func Open(ctx context.Context, dsn string) (*Locker, error) {
	c, err := parseURL(dsn)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redis: open: %w", err)
	}
	clients, tr := c.clients()
	l := newLocker(clients, c.Options, true, tr)
	cctx, cancel := context.WithTimeout(ctx, c.DialTimeout+c.readTimeout)
	defer cancel()
	if err := check(cctx, c, clients); err != nil {
		_ = l.Close()
		// A socket deadline taken from ctx can fire just before ctx does.
		rediscore.SettleDeadline(ctx, err)
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("redis: open: %w (%w)", cerr, err)
		}
		return nil, err
	}
	return l, nil
}

// clients builds the go-redis clients of the URL: one per Redlock master,
// else the one client of the deployment, with the tracker that watches its
// holds (nil under Redlock).
func (c *config) clients() ([]redis.UniversalClient, *tracker) {
	switch c.Mode() {
	case "redlock":
		clients := make([]redis.UniversalClient, 0, len(c.Addrs))
		for _, a := range c.Addrs {
			clients = append(clients, redis.NewClient(c.nodeOptions(a)))
		}
		return clients, nil
	case "cluster":
		cc := c.client().(*redis.ClusterClient)
		tr := newRoutedTracker(c.watchClientAt, func(ctx context.Context, lock string) (string, error) {
			n, err := cc.MasterForKey(ctx, lock)
			if err != nil {
				return "", err
			}
			return n.Options().Addr, nil
		}, c.Options.Prefix)
		tr.noloop = !c.AllowEviction // check refuses a policy that can evict otherwise
		return []redis.UniversalClient{cc}, tr
	}
	tr := newTracker(c.watchClient, c.Options.Prefix)
	tr.noloop = !c.AllowEviction // check refuses a policy that can evict otherwise
	return []redis.UniversalClient{c.client()}, tr
}

// New returns a Locker on a client the caller already has: a *redis.Client
// (single node), *redis.ClusterClient, or a failover (Sentinel) client. The
// Locker does not close client. A nil opts means every default (see
// Options). New makes no round trip, so ctx bounds nothing today; it is
// taken for symmetry with Open. Errors: a nil client or invalid options
// wrap driver.ErrInvalid.
//
// Configure the client with MaxRetries: -1 (go-redis retries a command
// whose reply was lost, and a retried release then reports ErrNotHeld for a
// lock it did free) and ContextTimeoutEnabled: true.
func New(ctx context.Context, client redis.UniversalClient, opts *Options) (*Locker, error) {
	clients := []redis.UniversalClient{client}
	o, err := rediscore.Adopted("redis", false, clients, opts.core())
	if err != nil {
		return nil, err
	}
	return newLocker(clients, o, false, nil), nil
}

// NewRedlock returns a Locker running Redlock over clients, one per
// independent master (at least 2; use 3 or more so that a node may fail).
// The Locker does not close the clients. opts is as for New; NewRedlock
// makes no round trip. Errors: fewer than 2 clients, a nil client, or
// invalid options wrap driver.ErrInvalid.
func NewRedlock(ctx context.Context, clients []redis.UniversalClient, opts *Options) (*Locker, error) {
	o, err := rediscore.Adopted("redis", true, clients, opts.core())
	if err != nil {
		return nil, err
	}
	return newLocker(clients, o, false, nil), nil
}

// newLocker builds a Locker over clients: one deployment, or the masters
// of a Redlock. owns: Close closes the clients. tr, if not nil, watches
// holds.
func newLocker(clients []redis.UniversalClient, o rediscore.Options, owns bool, tr *tracker) *Locker {
	conns := make([]rediscore.Conn, len(clients))
	w := &waiter{subs: make([]*subscriber, len(clients)), quorum: 1, tracker: tr}
	for i, c := range clients {
		cn := &conn{c: c, owns: owns}
		if tr != nil && tr.noloop {
			cn.tr = tr
		}
		conns[i] = cn
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
	return &Locker{core: rediscore.NewLocker(cfg), tr: tr}
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
