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

// Open implements driver.Driver: Open(context.Background(), dsn).
func (Driver) Open(dsn string) (driver.Locker, error) {
	return rediscore.Opened(Open(context.Background(), dsn))
}

// Locker is a driver.Locker on Redis through rueidis: a single node, a
// Cluster or a Sentinel-managed master (one round trip per call), or Redlock
// over several independent masters. Besides driver.Locker it implements
// driver.BlockingAcquirer, driver.Waiter, driver.HoldWatcher,
// driver.Inspector, driver.Capable and driver.Pinger. It is safe for
// concurrent use. Every error it returns starts with "rueidis: ".
type Locker struct {
	core *rediscore.Locker
	w    rediscore.Waiter // a *cscWaiter or a *pubsubWaiter
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

// newLocker builds a Locker over conns (one deployment, or the masters of
// a Redlock) waiting on w; hold, if not nil, watches holds.
// One deployment gets a listener on its script client for the fair
// queue's wake-ups.
func newLocker(w rediscore.Waiter, hold *rediscore.HoldWatch, o rediscore.Options, conns ...rediscore.Conn) *Locker {
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
// ctx bounds the connections and checks Open makes (each also bounded by
// dial_timeout), not the Locker. A single-node or Redlock URL pointing at a
// replica is refused unless allow_replica=true, and a server whose
// maxmemory-policy can evict lock keys unless allow_eviction=true (see the
// package documentation, Eviction). A Redlock URL opens when a quorum of
// its masters answers (see the package documentation).
//
// Errors: a malformed URL or an unknown query parameter wraps
// driver.ErrInvalid, before any I/O; a done ctx, ctx.Err() wrapped.
// Connection failures (unreachable server, wrong password, a port that does
// not speak Redis) name the address and the cause, and wrap
// driver.ErrUnavailable when the servers could not be reached (refused,
// unreachable, TLS or authentication failure, a Redlock without a quorum
// answering). A replica, or cluster=true on a server without cluster mode,
// wraps driver.ErrInvalid.
func Open(ctx context.Context, dsn string) (*Locker, error) {
	c, err := parseURL(dsn)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rueidis: open: %w", err)
	}
	w := newCSCWaiter()
	w.perNode = c.Options.NodeTimeout
	var l *Locker
	if c.redlock() {
		l, err = openRedlock(ctx, c, w)
	} else {
		l, err = openDeployment(ctx, c, w)
	}
	if err != nil {
		// A socket deadline taken from ctx can fire just before ctx does.
		rediscore.SettleDeadline(ctx, err)
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			err = fmt.Errorf("rueidis: open: %w (%w)", cerr, err)
		}
		return nil, err
	}
	return l, nil
}

// openDeployment is Open for a single server, a Cluster or a Sentinel
// master. The deployment gets two clients: one runs the scripts, without
// client-side caching (so rueidis can use its faster synchronous path when
// a call has the connection to itself), and one with tracking and the
// invalidation hook, for waiting.
func openDeployment(ctx context.Context, c *config, w *cscWaiter) (*Locker, error) {
	// The hook may run as soon as the watch client exists: the HoldWatch
	// is in place before, and reads through the client once it is set.
	var watchClient rueidis.Client
	w.hold = newHoldWatch(func() rueidis.Client { return watchClient }, c.Options.Prefix)
	addr := strings.Join(c.Addrs, ",")
	opt := c.clientOption(c.Addrs, nil)
	opt.DisableCache = true
	cmd, err := newClient(ctx, opt, addr)
	if err != nil {
		return nil, err
	}
	wopt := c.clientOption(c.Addrs, w)
	// NOLOOP is safe only where no command of this process can evict a
	// key (see trackedOptions): checkDeployment refuses any other policy
	// unless allow_eviction=true.
	tracked := !c.AllowEviction
	if tracked {
		trackedOptions(&wopt)
	}
	watch, err := newClient(ctx, wopt, addr)
	if err != nil {
		cmd.Close()
		return nil, err
	}
	if err := checkDeployment(ctx, cmd, addr, c); err != nil {
		cmd.Close()
		watch.Close()
		return nil, err
	}
	w.clients = []rueidis.Client{watch}
	w.piggyback = !c.Cluster
	watchClient = watch
	all := []rueidis.Client{cmd, watch}
	return newLocker(w, w.hold, c.Options, &conn{client: cmd, addr: addr, owned: all, watch: watch, w: w, timed: timedOption(opt), tracked: tracked}), nil
}

// trackedOptions makes opt's client (the watch client of a single server,
// Cluster or Sentinel master) track with NOLOOP over a single connection
// per node, so that the Locker's refreshes can run there and keep their
// key tracked (conn.tracked): the tracked scripts read the key again
// after writing it, and NOLOOP spares the connection the invalidation of
// its own write, which would make the hold watch read the key again after
// every renewal.
// NOLOOP also withholds an invalidation that a command of this connection
// causes indirectly: the lazy expiry of a key it touches, which the
// scripts' replies show (see conn.ownWrite), and an eviction made room for
// it, which a server with maxmemory-policy noeviction never makes. One
// connection, because rueidis spreads a client's commands over its
// connections at random, and NOLOOP spares only the connection that wrote.
func trackedOptions(opt *rueidis.ClientOption) {
	opt.ClientTrackingOptions = []string{"OPTOUT", "NOLOOP"}
	opt.PipelineMultiplex = -1
}

// checkDeployment is Open's check of a single server, Cluster or Sentinel
// master through cmd: cluster=true needs a Cluster, a single server must be
// a master, and no server may evict lock keys (see Open).
func checkDeployment(ctx context.Context, cmd rueidis.Client, addr string, c *config) error {
	if c.Cluster && cmd.Mode() != rueidis.ClientModeCluster {
		return fmt.Errorf("rueidis: %s: cluster=true but the server is not a Redis Cluster (cluster mode disabled): %w", addr, driver.ErrInvalid)
	}
	if !c.Cluster && c.SentinelMaster == "" {
		if err := checkMaster(ctx, cmd, addr, c); err != nil {
			return err
		}
	}
	return checkEviction(ctx, cmd, addr, c)
}

// New returns a Locker on a client the caller already has (single node,
// Cluster or Sentinel). The Locker does not close client. Since rueidis
// fixes a client's invalidation hook when the client is built, an adopted
// client waits on the key's pub/sub channel (the release script publishes
// on it) instead of on client-side-caching invalidations; expiries are
// covered by package locker's wake-up at the holder's remaining TTL. Use
// NewWithClientOption to get invalidation-based waits with your own client
// settings. A nil opts means every default (see Options). New makes no
// round trip, so ctx bounds nothing today; it is taken for symmetry with
// Open. Errors: a nil client or invalid options wrap driver.ErrInvalid.
func New(ctx context.Context, client rueidis.Client, opts *Options) (*Locker, error) {
	clients := []rueidis.Client{client}
	o, err := rediscore.Adopted(Scheme, false, clients, opts.core())
	if err != nil {
		return nil, err
	}
	addr := strings.Join(addrsOf(client), ",")
	return newLocker(newPubSubWaiter(clients, o.NodeTimeout), nil, o, &conn{client: client, addr: addr}), nil
}

// NewRedlock returns a Locker running Redlock over clients, one per
// independent master (at least 2; use 3 or more so that a node may fail).
// The Locker does not close the clients; it waits on pub/sub, as New does.
// opts is as for New; NewRedlock makes no round trip. Errors: fewer than 2
// clients, a nil client, or invalid options wrap driver.ErrInvalid.
func NewRedlock(ctx context.Context, clients []rueidis.Client, opts *Options) (*Locker, error) {
	o, err := rediscore.Adopted(Scheme, true, clients, opts.core())
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
// still called). The Locker owns both and waits on invalidations. ctx
// bounds the connecting, as for Open; NewWithClientOption makes no ROLE or
// eviction check. opt.DisableCache must be false; opts is as for New.
// Errors: invalid options or opt.DisableCache wrap driver.ErrInvalid,
// before any I/O; a done ctx, ctx.Err() wrapped; otherwise those of
// rueidis.NewClient, naming the cause.
func NewWithClientOption(ctx context.Context, opt rueidis.ClientOption, opts *Options) (*Locker, error) {
	o, err := rediscore.CheckOptions(Scheme, opts.core())
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
	cmd, err := newClient(ctx, cmdOpt, addr)
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
	watch, err := newClient(ctx, opt, addr)
	if err != nil {
		cmd.Close()
		return nil, err
	}
	w.clients = []rueidis.Client{watch}
	w.piggyback = watch.Mode() != rueidis.ClientModeCluster
	watchClient = watch
	all := []rueidis.Client{cmd, watch}
	return newLocker(w, w.hold, o, &conn{client: cmd, addr: addr, owned: all, watch: watch, w: w, timed: timedOption(opt)}), nil
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
// rueidis.NewClient dials at once and takes no context: if ctx ends first,
// newClient returns ctx.Err() wrapped, and the client, once built, is
// closed in the background.
func newClient(ctx context.Context, opt rueidis.ClientOption, addr string) (rueidis.Client, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("rueidis: connect to %s: %w", addr, err)
	}
	type built struct {
		cl  rueidis.Client
		err error
	}
	done := make(chan built, 1)
	go func() {
		cl, err := rueidis.NewClient(opt)
		done <- built{cl, err}
	}()
	select {
	case b := <-done:
		if b.err != nil {
			return nil, rediscore.AsUnavailable(fmt.Errorf("rueidis: connect to %s: %w", addr, describe(b.err)))
		}
		return b.cl, nil
	case <-ctx.Done():
		go func() {
			if b := <-done; b.cl != nil {
				b.cl.Close()
			}
		}()
		return nil, fmt.Errorf("rueidis: connect to %s: %w", addr, ctx.Err())
	}
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
// ctx and dial_timeout bound it.
func checkMaster(ctx context.Context, cl rueidis.Client, addr string, c *config) error {
	if c.AllowReplica {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
	defer cancel()
	return rediscore.CheckMaster(ctx, Scheme, addr, false, doFunc(cl).Explain(describe))
}

// checkEviction refuses a deployment whose maxmemory-policy can evict lock
// keys unless allow_eviction=true (rediscore.CheckEviction): on a Cluster
// every node, replicas included (one is promoted on a failover with the
// policy it has); on Sentinel the master; else the one server. ctx and
// dial_timeout bound it.
func checkEviction(ctx context.Context, cl rueidis.Client, addr string, c *config) error {
	if c.AllowEviction {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.DialTimeout)
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
