package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

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
func (Driver) Open(dsn string) (driver.Locker, error) {
	l, err := Open(dsn)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Options are the driver options shared with drivers/rueidis (the URL
// parameters prefix, node_timeout, drift_factor, max_key_len,
// token_retention). The zero value of every field means its default:
// Prefix "locker", NodeTimeout 100ms, DriftFactor 0.01, MaxKeyLen 4096
// bytes, TokenRetention 10m.
type Options = rediscore.Options

// lockerCore is what rediscore.Node and rediscore.Redlock implement.
type lockerCore interface {
	driver.Locker
	driver.Inspector
	driver.Capable
	driver.Pinger
}

// Locker is a driver.Locker on Redis through go-redis: a single node, a
// Cluster or a Sentinel-managed master (one round trip per call), or Redlock
// over several independent masters. It also implements driver.Waiter
// (pub/sub on the channel the release script publishes to), driver.Inspector,
// driver.Capable and driver.Pinger. It is safe for concurrent use.
type Locker struct {
	core    lockerCore
	subs    []*subscriber // one per deployment; N for Redlock
	quorum  int           // subscriptions Subscribe needs (1, or N/2+1)
	prefix  string
	maxKey  int
	tracker *tracker // hold watching; nil where unsupported
	closeMu sync.Mutex
	closed  bool
}

var (
	_ driver.Locker    = (*Locker)(nil)
	_ driver.Waiter    = (*Locker)(nil)
	_ driver.Inspector = (*Locker)(nil)
	_ driver.Capable   = (*Locker)(nil)
	_ driver.Pinger    = (*Locker)(nil)

	_ driver.BlockingAcquirer = (*Locker)(nil)
)

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
	var l *Locker
	if c.Mode() == "redlock" {
		clients := make([]redis.UniversalClient, len(c.Addrs))
		for i, a := range c.Addrs {
			clients[i] = redis.NewClient(c.nodeOptions(a))
		}
		l = newRedlock(clients, c.Options, true)
	} else {
		l = newLocker(c.client(), c.Options, true)
		if c.Mode() == "single" || c.Mode() == "sentinel" {
			l.tracker = newTracker(c.watchClient, c.Options.Prefix)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.DialTimeout+c.readTimeout)
	defer cancel()
	if err := l.check(ctx, c); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

// New returns a Locker on a client the caller already has: a *redis.Client
// (single node), *redis.ClusterClient, or a failover (Sentinel) client. The
// Locker does not close client. opts (at most one) sets the key prefix,
// limits and token retention; zero fields take their defaults. New makes no
// round trip. Errors: invalid options wrap driver.ErrInvalid.
//
// Configure the client with MaxRetries: -1 (go-redis retries a command
// whose reply was lost, and a retried release then reports ErrNotHeld for a
// lock it did free) and ContextTimeoutEnabled: true.
func New(client redis.UniversalClient, opts ...Options) (*Locker, error) {
	o, err := oneOptions(opts)
	if err != nil {
		return nil, err
	}
	if client == nil {
		return nil, fmt.Errorf("redis: nil client: %w", driver.ErrInvalid)
	}
	return newLocker(client, o, false), nil
}

// NewRedlock returns a Locker running Redlock over clients, one per
// independent master (at least 2; use 3 or more so that a node may fail).
// The Locker does not close the clients. Errors: fewer than 2 clients, a
// nil client, or invalid options wrap driver.ErrInvalid.
func NewRedlock(clients []redis.UniversalClient, opts ...Options) (*Locker, error) {
	o, err := oneOptions(opts)
	if err != nil {
		return nil, err
	}
	if len(clients) < 2 {
		return nil, fmt.Errorf("redis: Redlock needs at least 2 clients, got %d: %w", len(clients), driver.ErrInvalid)
	}
	for i, c := range clients {
		if c == nil {
			return nil, fmt.Errorf("redis: client %d is nil: %w", i, driver.ErrInvalid)
		}
	}
	return newRedlock(clients, o, false), nil
}

func oneOptions(opts []Options) (Options, error) {
	var o Options
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return o, fmt.Errorf("redis: at most one Options, got %d: %w", len(opts), driver.ErrInvalid)
	}
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o.WithDefaults(), nil
}

func newLocker(c redis.UniversalClient, o Options, owns bool) *Locker {
	o = o.WithDefaults()
	sub := newSubscriber(c)
	n := rediscore.NewNode(&conn{c: c, owns: owns}, o)
	n.SetListener(sub)
	return &Locker{
		core:   n,
		subs:   []*subscriber{sub},
		quorum: 1, prefix: o.Prefix, maxKey: o.MaxKeyLen,
	}
}

func newRedlock(clients []redis.UniversalClient, o Options, owns bool) *Locker {
	o = o.WithDefaults()
	conns := make([]rediscore.Conn, len(clients))
	subs := make([]*subscriber, len(clients))
	for i, c := range clients {
		conns[i] = &conn{c: c, owns: owns}
		subs[i] = newSubscriber(c)
	}
	rl := rediscore.NewRedlock(conns, o)
	return &Locker{core: rl, subs: subs, quorum: rl.Quorum(), prefix: o.Prefix, maxKey: o.MaxKeyLen}
}

// check is Open's start-up check (see Open).
func (l *Locker) check(ctx context.Context, c *config) error {
	if c.Mode() == "cluster" || c.Mode() == "sentinel" {
		cl := l.subs[0].client
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
	errs := make([]error, len(l.subs))
	var wg sync.WaitGroup
	for i, s := range l.subs {
		wg.Go(func() {
			errs[i] = checkMaster(ctx, s.client, c.Addrs[i], c.AllowReplica)
			if errs[i] == nil {
				errs[i] = rediscore.CheckEviction(ctx, "redis", c.Addrs[i], c.AllowEviction, doFunc(s.client))
			}
		})
	}
	wg.Wait()
	// A replica or an evicting server is always refused. Redlock tolerates
	// unreachable nodes as long as a quorum answered: it is built to run
	// with some nodes down.
	failed := 0
	for _, err := range errs {
		if errors.Is(err, driver.ErrInvalid) || errors.Is(err, rediscore.ErrEvictionPolicy) {
			return err
		}
		if err != nil {
			failed++
		}
	}
	if failed > 0 && len(l.subs) == 1 {
		return errs[0]
	}
	if failed > len(l.subs)-l.quorum {
		return rediscore.AsUnavailable(fmt.Errorf("redis: Redlock: %d of %d nodes failed, quorum %d: %w", failed, len(l.subs), l.quorum, errors.Join(errs...)))
	}
	return nil
}

// checkMaster runs ROLE on one node: it must answer, and be a master.
func checkMaster(ctx context.Context, c redis.UniversalClient, addr string, allowReplica bool) error {
	v, err := c.Do(ctx, "ROLE").Slice()
	if err != nil {
		return fmt.Errorf("redis: %s: %w", addr, explain(err))
	}
	if len(v) == 0 {
		return fmt.Errorf("redis: %s: unexpected ROLE reply %v (is this a Redis server?)", addr, v)
	}
	role, _ := v[0].(string)
	if role == "master" || allowReplica {
		return nil
	}
	master := ""
	if role == "slave" && len(v) >= 3 {
		master = fmt.Sprintf(" of %v:%v", v[1], v[2])
	}
	return fmt.Errorf("redis: %s is a %s%s, not a master: locks written there are lost or refused; point the URL at the master, use sentinel_master, or set allow_replica=true: %w",
		addr, role, master, driver.ErrInvalid)
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

// Acquire implements driver.Locker (see rediscore.Node.Acquire and
// rediscore.Redlock.Acquire): a *driver.HeldError when another owner holds
// key, driver.ErrInvalid for bad arguments, driver.ErrClosed after Close.
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.core.Acquire(ctx, key, owner, ttl)
}

// AcquireWait implements driver.BlockingAcquirer: it waits until key is
// granted to owner. On a single node, Cluster or Sentinel the waiters
// queue on the server and are granted in arrival order, each release
// waking only the next one (see the package documentation, Fairness);
// with fair=false, and under Redlock, every waiter is woken and the first
// to retry wins. Errors as for Acquire, except that another owner holding
// key is not one: ctx bounds the wait, and its end returns an error
// wrapping ctx.Err() with nothing held or queued.
func (l *Locker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	sub := func(ctx context.Context) (<-chan struct{}, func(), error) { return l.Subscribe(ctx, key) }
	if n, ok := l.core.(*rediscore.Node); ok {
		return n.AcquireWait(ctx, key, owner, ttl, sub)
	}
	return rediscore.BargeWait(ctx, func(ctx context.Context) (uint64, error) { return l.Acquire(ctx, key, owner, ttl) }, sub)
}

// Refresh implements driver.Locker: driver.ErrNotHeld if owner does not
// hold key; an expired lock is never revived.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return l.core.Refresh(ctx, key, owner, ttl)
}

// Release implements driver.Locker: driver.ErrNotHeld if owner does not
// hold key. A release publishes on the key's channel, waking waiters.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	if l.tracker == nil {
		return l.core.Release(ctx, key, owner)
	}
	done := l.tracker.hold.Releasing(key, owner)
	err := l.core.Release(ctx, key, owner)
	done(err)
	return err
}

// Inspect implements driver.Inspector: driver.ErrNotHeld if key is free.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return l.core.Inspect(ctx, key)
}

// Capabilities implements driver.Capable: MinTTL 10ms (Redlock: 3 ×
// node_timeout), millisecond granularity, tokens that survive a restart of
// the server (floored at its clock; see the package documentation).
func (l *Locker) Capabilities() driver.Capabilities { return l.core.Capabilities() }

// Ping implements driver.Pinger (Redlock: a quorum must answer).
func (l *Locker) Ping(ctx context.Context) error { return l.core.Ping(ctx) }

// Subscribe implements driver.Waiter over pub/sub: from its return, wake
// receives a value whenever key's lock is released (and after a lost
// connection is re-established). All waits of this Locker share one pub/sub
// connection per server, and all waiters of one key one SUBSCRIBE. Under
// Redlock, Subscribe returns once a quorum of nodes confirmed the
// subscription (a release runs on a quorum, so one of them publishes);
// failing that, an error naming the counts. Errors: driver.ErrInvalid for a
// bad key, driver.ErrClosed after Close, ctx.Err() wrapped once ctx is done.
func (l *Locker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if l.isClosed() {
		return nil, nil, fmt.Errorf("redis: %w", driver.ErrClosed)
	}
	if err := rediscore.CheckKey(key, l.maxKey); err != nil {
		return nil, nil, err
	}
	_, _, channel := rediscore.Keys(l.prefix, key)
	wake := make(chan struct{}, 1)
	if len(l.subs) == 1 {
		cancel, err := l.subs[0].Subscribe(ctx, channel, wake)
		if err != nil {
			return nil, nil, err
		}
		return wake, cancel, nil
	}
	return l.subscribeQuorum(ctx, channel, wake)
}

func (l *Locker) subscribeQuorum(ctx context.Context, channel string, wake chan struct{}) (<-chan struct{}, func(), error) {
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	type result struct {
		cancel func()
		err    error
	}
	results := make(chan result, len(l.subs))
	for _, s := range l.subs {
		go func() {
			c, err := s.Subscribe(sctx, channel, wake)
			results <- result{c, err}
		}()
	}
	var (
		mu       sync.Mutex
		cancels  []func()
		finished bool
	)
	// collect keeps the cancel funcs of subscriptions that succeed after
	// Subscribe returned.
	collect := func(r result) {
		if r.err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if finished {
			r.cancel()
			return
		}
		cancels = append(cancels, r.cancel)
	}
	cancelAll := func() {
		stop()
		mu.Lock()
		defer mu.Unlock()
		finished = true
		for _, c := range cancels {
			c()
		}
		cancels = nil
	}
	ok, failed := 0, 0
	var first error
	for ok < l.quorum && failed < len(l.subs)-l.quorum+1 {
		select {
		case r := <-results:
			collect(r)
			if r.err == nil {
				ok++
			} else {
				failed++
				if first == nil {
					first = r.err
				}
			}
		case <-ctx.Done():
			go drain(results, len(l.subs)-ok-failed, collect)
			cancelAll()
			return nil, nil, fmt.Errorf("redis: subscribe: %w", ctx.Err())
		}
	}
	go drain(results, len(l.subs)-ok-failed, collect)
	if ok < l.quorum {
		cancelAll()
		return nil, nil, fmt.Errorf("redis: redlock subscribe: %d of %d nodes confirmed (quorum %d): %w", ok, len(l.subs), l.quorum, first)
	}
	var once sync.Once
	return wake, func() { once.Do(cancelAll) }, nil
}

func drain[T any](ch <-chan T, n int, f func(T)) {
	for range n {
		f(<-ch)
	}
}

func (l *Locker) isClosed() bool {
	l.closeMu.Lock()
	defer l.closeMu.Unlock()
	return l.closed
}

// Close ends every wait (waiters are woken once) and closes the clients if
// Open created them. It is idempotent; later calls of every method return
// driver.ErrClosed.
func (l *Locker) Close() error {
	l.closeMu.Lock()
	if l.closed {
		l.closeMu.Unlock()
		return nil
	}
	l.closed = true
	l.closeMu.Unlock()
	if l.tracker != nil {
		l.tracker.close()
	}
	for _, s := range l.subs {
		s.close()
	}
	return l.core.Close()
}
