package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// Scheme is the URL scheme, and the name the driver is registered under.
const Scheme = "etcd"

// MaxKeyLen is the longest key the driver accepts, in bytes.
const MaxKeyLen = 4096

// MaxOwnerLen is the longest owner string the driver accepts, in bytes.
const MaxOwnerLen = 1024

func init() { locker.Register(Scheme, Driver{}) }

var (
	_ driver.Driver    = Driver{}
	_ driver.Locker    = (*Locker)(nil)
	_ driver.Waiter    = (*Locker)(nil)
	_ driver.Inspector = (*Locker)(nil)
	_ driver.Capable   = (*Locker)(nil)
	_ driver.Pinger    = (*Locker)(nil)
)

// Driver opens Lockers from etcd:// URLs. It is registered with package
// locker under the name "etcd".
type Driver struct{}

// Open calls the package-level Open with context.Background().
func (Driver) Open(dsn string) (driver.Locker, error) {
	return Open(context.Background(), dsn)
}

// Open parses dsn (see the package documentation for the format) and
// returns a Locker with its own client, which Close closes. Without user
// and password it makes no request: an unreachable cluster shows up as
// errors wrapping driver.ErrUnavailable from the first calls, each bounded
// by request_timeout. With user and password, Open authenticates at once,
// within dial_timeout, and an unreachable cluster or refused credentials
// are an error wrapping driver.ErrUnavailable.
//
// ctx bounds Open only: once it is done, Open returns ctx.Err() (wrapped)
// and closes the client it was creating; it is not kept by the Locker.
//
// Errors: a malformed URL, an unknown, repeated or bad query parameter, or
// an invalid key prefix wraps driver.ErrInvalid (before any I/O, and never
// containing the password).
func Open(ctx context.Context, dsn string) (*Locker, error) {
	cfg, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("etcd: open: %w", err)
	}
	c, err := dial(ctx, clientv3.Config{
		Endpoints:            cfg.endpoints,
		AutoSyncInterval:     cfg.autoSync,
		DialTimeout:          cfg.dialTimeout,
		DialKeepAliveTime:    cfg.keepAliveTime,
		DialKeepAliveTimeout: cfg.keepAliveTimeout,
		TLS:                  cfg.tls,
		Username:             cfg.username,
		Password:             cfg.password,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		return nil, err
	}
	return newLocker(c, true, cfg.prefix, cfg.minTTL, cfg.requestTimeout), nil
}

// dial creates a client for cfg, giving up when ctx is done (the client,
// if it comes later, is closed).
func dial(ctx context.Context, cfg clientv3.Config) (*clientv3.Client, error) {
	type result struct {
		c   *clientv3.Client
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := clientv3.New(cfg)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			// With credentials, New authenticates at once: the cluster was
			// unreachable, or refused the user name or password.
			return nil, fmt.Errorf("etcd: connect to %v: %w: %w", cfg.Endpoints, driver.ErrUnavailable, r.err)
		}
		return r.c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.c != nil {
				_ = r.c.Close()
			}
		}()
		return nil, fmt.Errorf("etcd: connect to %v: %w", cfg.Endpoints, ctx.Err())
	}
}

// Options configures New. A nil *Options, and the zero value, mean every
// default.
type Options struct {
	// Prefix is the key prefix, like the URL path: "/app" stores locks
	// under "/app/l/". Empty means DefaultPrefix ("/locker"). The rules
	// are those of the URL path (see the package documentation).
	Prefix string
	// MinTTL is the shortest TTL accepted, a whole number of seconds.
	// Zero means DefaultMinTTL (2s).
	MinTTL time.Duration
	// RequestTimeout bounds each request, whatever the context's deadline.
	// Zero means DefaultRequestTimeout (10s).
	RequestTimeout time.Duration
}

// New returns a Locker that uses the caller's client c, configured by opts
// (nil means every default). Close does not close c. New makes no request;
// ctx is not kept.
//
// Errors: driver.ErrInvalid if c is nil or opts is invalid (a bad prefix,
// MinTTL not a whole number of seconds, negative values).
func New(ctx context.Context, c *clientv3.Client, opts *Options) (*Locker, error) {
	if c == nil {
		return nil, invalid("nil client")
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	prefix, err := cleanPrefix(o.Prefix)
	if err != nil {
		return nil, err
	}
	minTTL := o.MinTTL
	switch {
	case minTTL == 0:
		minTTL = DefaultMinTTL
	case minTTL < 0 || minTTL%time.Second != 0:
		return nil, invalid("MinTTL %v: want a positive whole number of seconds", minTTL)
	}
	rt := o.RequestTimeout
	switch {
	case rt == 0:
		rt = DefaultRequestTimeout
	case rt < 0:
		return nil, invalid("RequestTimeout %v is negative", rt)
	}
	return newLocker(c, false, prefix, minTTL, rt), nil
}

// Locker is the etcd driver.Locker. It also implements driver.Waiter,
// driver.HoldWatcher, driver.Inspector, driver.Capable, driver.Pinger and
// driver.SharedLocker. It is safe for concurrent use.
type Locker struct {
	c              *clientv3.Client
	ownsClient     bool
	prefix         string // "/locker"
	minTTL         time.Duration
	requestTimeout time.Duration

	// base is cancelled by Close; watches and background work use it.
	base   context.Context
	cancel context.CancelFunc
	bg     sync.WaitGroup
	closed atomic.Bool

	mu    sync.Mutex
	held  map[string]holding // lock key → what this Locker granted
	spare map[int64][]lease  // TTL seconds → unused leases

	// The session lease holds this Locker's wait-queue entries.
	sessMu   sync.Mutex
	sess     clientv3.LeaseID
	sessDone chan struct{} // closed when the session's keepalive ends
	seq      atomic.Uint64 // numbers queue entries

	ka [kaStreams]keepalives
	oc ownerChecks
	// turns of Acquire and of Release attempts (see maxWrites)
	acquireTurns, releaseTurns chan struct{}

	// Own releases, told apart from other deletes by the hold watches
	// (guarded by mu; see ownRelease).
	watched  map[string]int         // lock key → hold watches on it
	releases map[string]*releaseLog // lock key → releases, while watched

	ttls leaseTTLs // lease reads started by change watches (changes.go)
}

func newLocker(c *clientv3.Client, owns bool, prefix string, minTTL, rt time.Duration) *Locker {
	base, cancel := context.WithCancel(context.Background())
	return &Locker{
		c:              c,
		ownsClient:     owns,
		prefix:         prefix,
		minTTL:         minTTL,
		requestTimeout: rt,
		base:           base,
		cancel:         cancel,
		held:           make(map[string]holding),
		watched:        make(map[string]int),
		releases:       make(map[string]*releaseLog),
		spare:          make(map[int64][]lease),
		acquireTurns:   make(chan struct{}, maxWrites),
		releaseTurns:   make(chan struct{}, maxWrites),
	}
}

// Client returns the underlying etcd client.
func (l *Locker) Client() *clientv3.Client { return l.c }

// Prefix returns the key prefix, for example "/locker".
func (l *Locker) Prefix() string { return l.prefix }

// LockKey returns the etcd key that holds the lock named key:
// prefix + "/l/" + key.
func (l *Locker) LockKey(key string) string { return l.prefix + "/l/" + key }

// Capabilities reports the minimum TTL (2s unless min_ttl says otherwise),
// whole-second granularity (etcd leases are whole seconds), and durable
// tokens (revisions survive restarts; only a cluster rebuilt from empty data
// starts them over).
func (l *Locker) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: l.minTTL, TTLGranularity: time.Second, DurableTokens: true, MaxOwner: MaxOwnerLen}
}

// Ping makes one linearizable read, so it fails when the cluster has no
// quorum. It returns driver.ErrClosed after Close.
func (l *Locker) Ping(ctx context.Context) error {
	if l.closed.Load() {
		return fmt.Errorf("etcd: ping: %w", driver.ErrClosed)
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	if _, err := l.c.Get(cctx, l.prefix+"/ping", clientv3.WithCountOnly()); err != nil {
		return l.fail(ctx, "ping", "", err)
	}
	return nil
}

// Close stops watches, revokes unused leases (locks still held are left to
// expire) and, for a Locker from Open, closes the client. It is idempotent;
// every call after the first returns nil, and other methods return
// driver.ErrClosed.
func (l *Locker) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.mu.Lock() // after this, goBG sees closed and adds no work
	var spare []lease
	for _, ls := range l.spare {
		spare = append(spare, ls...)
	}
	l.spare = nil
	l.mu.Unlock()
	if len(spare) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), bgTimeout)
		var wg sync.WaitGroup
		for _, le := range spare {
			wg.Add(1)
			go func() { defer wg.Done(); _, _ = l.c.Revoke(ctx, le.id) }()
		}
		wg.Wait()
		cancel()
	}
	l.cancel() // ends watches and the session keepalive
	l.sessMu.Lock()
	sess := l.sess
	l.sess = clientv3.NoLease
	l.sessMu.Unlock()
	if sess != clientv3.NoLease {
		// Deletes this Locker's queue entries, waking their successors.
		ctx, cancel := context.WithTimeout(context.Background(), bgTimeout)
		_, _ = l.c.Revoke(ctx, sess)
		cancel()
	}
	l.bg.Wait()
	if l.ownsClient {
		if err := l.c.Close(); err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("etcd: close: %w", err)
		}
	}
	return nil
}

// opCtx bounds a request by requestTimeout, or by ctx's deadline if that
// comes first. A ctx whose deadline comes first is returned as it is, with
// a cancel that does nothing: a renewal's context has such a deadline, and
// a wrapper would cost each renewal a context and a timer.
func (l *Locker) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= l.requestTimeout {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, l.requestTimeout)
}

// fail wraps err from operation op on key: driver.ErrClosed after Close,
// and ctx.Err() when the caller's context is done.
func (l *Locker) fail(ctx context.Context, op, key string, err error) error {
	where := "etcd: " + op
	if key != "" {
		where += fmt.Sprintf(" %.100q", key)
	}
	if errors.Is(err, driver.ErrClosed) || errors.Is(err, driver.ErrInvalid) ||
		errors.Is(err, driver.ErrNotHeld) || errors.Is(err, driver.ErrNotAcquired) {
		return fmt.Errorf("%s: %w", where, err)
	}
	cerr := ctx.Err()
	if dl, ok := ctx.Deadline(); ok && cerr == nil && !time.Now().Before(dl) {
		// The caller's deadline has passed, but ctx's timer has not fired
		// yet: the server, which got the same deadline, may answer "request
		// timed out" first.
		cerr = context.DeadlineExceeded
	}
	if cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("%s: %w", where, err)
		}
		return fmt.Errorf("%s: %w (%v)", where, cerr, err)
	}
	if l.closed.Load() {
		return fmt.Errorf("%s: %w", where, driver.ErrClosed)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Our own request_timeout, not the caller's deadline.
		return fmt.Errorf("%s: %w: no answer from %v within the request timeout (%v): %w",
			where, driver.ErrUnavailable, l.c.Endpoints(), l.requestTimeout, err)
	}
	if unavailable(err) {
		return fmt.Errorf("%s: %w: %w", where, driver.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// unavailable reports whether err means the cluster could not serve the
// request at all: no connection (refused, reset, TLS handshake), no leader
// or quorum, a request the server timed out, a keepalive stream that
// broke, or failed authentication. An answer about the lock never is.
func unavailable(err error) bool {
	if errors.Is(err, errStreamEnded) {
		return true
	}
	err = rpctypes.Error(err)
	switch {
	case errors.Is(err, rpctypes.ErrAuthFailed), errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unavailable || ee.Code() == codes.Unauthenticated
	}
	if st, ok := status.FromError(err); ok {
		return st.Code() == codes.Unavailable || st.Code() == codes.Unauthenticated ||
			st.Code() == codes.DeadlineExceeded
	}
	return false
}

// check validates the arguments shared by the lock operations.
func (l *Locker) check(op, key, owner string) error {
	switch {
	case key == "":
		return invalid("%s: empty key", op)
	case len(key) > MaxKeyLen:
		return invalid("%s: key is %d bytes, the limit is %d", op, len(key), MaxKeyLen)
	case owner == "":
		return invalid("%s: empty owner", op)
	case len(owner) > MaxOwnerLen:
		return invalid("%s: owner is %d bytes, the limit is %d", op, len(owner), MaxOwnerLen)
	case l.closed.Load():
		return fmt.Errorf("etcd: %s: %w", op, driver.ErrClosed)
	}
	return nil
}

// ttlSeconds validates ttl and returns it in whole seconds, rounded up.
func (l *Locker) ttlSeconds(op string, ttl time.Duration) (int64, error) {
	if ttl <= 0 {
		return 0, invalid("%s: ttl %v is not positive", op, ttl)
	}
	if ttl < l.minTTL {
		return 0, invalid("%s: ttl %v is under the minimum %v", op, ttl, l.minTTL)
	}
	return int64((ttl + time.Second - 1) / time.Second), nil
}

// bgTimeout bounds background clean-up requests (revoking leases).
const bgTimeout = 2 * time.Second

// goBG runs f in the background; Close waits for it. f gets a context that
// Close does not cancel, bounded by bgTimeout. After Close, f runs in the
// caller.
func (l *Locker) goBG(f func(ctx context.Context)) {
	run := func() {
		ctx, cancel := context.WithTimeout(context.Background(), bgTimeout)
		defer cancel()
		f(ctx)
	}
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		run()
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		run()
	}()
}
