package rediscore

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// MinTTL is the shortest TTL a single node (or Cluster, or Sentinel) Node
// honours; TTLs are kept in whole milliseconds (PX).
const MinTTL = 10 * time.Millisecond

// Node implements driver.Locker, driver.Inspector, driver.Capable and
// driver.Pinger on one Conn (a single node, a Cluster or a Sentinel-managed
// master): one script, one round trip per call.
type Node struct {
	p       prefix // starts every error
	c       Conn
	o       Options
	closeMu sync.Mutex // orders enter against Close
	closed  atomic.Bool
	done    chan struct{} // closed by Close
	jobs    chan *job     // to idle workers (worker.go)
	idle    atomic.Int64  // workers idle and not claimed
	workers atomic.Int64  // workers running (tests)
	timed   bool          // c bounds each call itself (TimedConn)
	retMS   string

	// The fair queue (queue.go).
	wid       string // this Node's id in queue elements and wake channel
	listener  Listener
	listenMu  sync.Mutex
	listening atomic.Bool
	sharded   bool // a Cluster: PUBLISH counts only one node's subscribers
	route     router
	bg        sync.WaitGroup // calls and clean-ups Close waits for (bounded)

	// abandoned, when set (tests), is called with the outcome of an
	// acquire whose caller gave up, once the clean-up is done.
	abandoned func(grant)
}

// NewNode returns a Node over c. Zero fields of o take their defaults; o is
// not validated (call Options.Validate or ParseOptions first). Close closes c.
func NewNode(c Conn, o Options) *Node {
	o = o.WithDefaults()
	tc, ok := c.(TimedConn)
	return &Node{p: "redis", c: c, o: o, done: make(chan struct{}), jobs: make(chan *job), wid: newWID(),
		retMS: strconv.FormatInt(o.TokenRetention.Milliseconds(), 10), timed: ok && tc.Timed()}
}

// Options returns the options in effect, defaults applied.
func (n *Node) Options() Options { return n.o }

// Capabilities reports MinTTL 10ms, millisecond granularity, and durable
// tokens (floored at the server clock, see AcquireScript).
func (n *Node) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: MinTTL, TTLGranularity: time.Millisecond, DurableTokens: true}
}

// CheckKey returns an error wrapping driver.ErrInvalid if key is empty or
// longer than max bytes. Its errors start with "redis: ".
func CheckKey(key string, max int) error { return prefix("redis").checkKey(key, max) }

func (p prefix) checkKey(key string, max int) error {
	if key == "" {
		return p.errorf("empty key: %w", driver.ErrInvalid)
	}
	if len(key) > max {
		return p.errorf("key of %d bytes exceeds max_key_len %d: %w", len(key), max, driver.ErrInvalid)
	}
	return nil
}

func (p prefix) checkOwner(owner string) error {
	if owner == "" {
		return p.errorf("empty owner: %w", driver.ErrInvalid)
	}
	return nil
}

func (p prefix) checkTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return p.errorf("ttl %v must be positive: %w", ttl, driver.ErrInvalid)
	}
	return nil
}

func (n *Node) check(ctx context.Context, key, owner string, ttl time.Duration, needTTL, needOwner bool) error {
	return n.p.checkCall(ctx, n.closed.Load(), n.o.MaxKeyLen, key, owner, ttl, needTTL, needOwner)
}

// checkCall validates one call's arguments, for Node and Redlock alike:
// ErrClosed, then the key, the owner and the ttl (driver.ErrInvalid), then
// ctx.
func (p prefix) checkCall(ctx context.Context, closed bool, maxKeyLen int, key, owner string, ttl time.Duration, needTTL, needOwner bool) error {
	if closed {
		return p.errorf("%w", driver.ErrClosed)
	}
	if err := p.checkKey(key, maxKeyLen); err != nil {
		return err
	}
	if needOwner {
		if err := p.checkOwner(owner); err != nil {
			return err
		}
	}
	if needTTL {
		if err := p.checkTTL(ttl); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return p.errorf("%w", err)
	}
	return nil
}

// ttlMS returns ttl rounded up to whole milliseconds and MinTTL, as a string.
func ttlMS(c driver.Capabilities, ttl time.Duration) string {
	return strconv.FormatInt(c.RoundTTL(ttl).Milliseconds(), 10)
}

// Acquire implements driver.Locker: one EVALSHA of AcquireScript. When the
// key is held by another owner it returns a *driver.HeldError carrying the
// holder's PTTL. Bad arguments wrap driver.ErrInvalid; after Close,
// driver.ErrClosed.
func (n *Node) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := n.check(ctx, key, owner, ttl, true, true); err != nil {
		return 0, err
	}
	exit, ok := n.enter()
	if !ok {
		return 0, n.p.errorf("%w", driver.ErrClosed)
	}
	defer exit()
	lock, counter, ch := Keys(n.o.Prefix, key)
	keys := []string{lock, counter}
	ms := ttlMS(n.Capabilities(), ttl)
	// The script runs detached from ctx's cancellation so that, if ctx
	// ends first, we learn the outcome and delete a grant nobody will use.
	// Only a grant this call created is deleted, by its token: a lock owner
	// held before the call (another Locker with the same owner, a WithOwner
	// hand-over) stays held. When the reply is lost too, the outcome is
	// unknown and nothing is deleted: a grant the call may have made
	// expires at its TTL, while deleting by owner could free a lock held
	// before the call.
	r, err, abandoned := n.runDetached(ctx, AcquireScript, keys, []string{owner, ms, n.retMS}, func(g grant) {
		if g.kind == grantCreated {
			n.cleanup(lock, ch, owner, g.token)
		}
		if n.abandoned != nil {
			n.abandoned(g)
		}
	})
	if abandoned {
		return 0, n.p.errorf("acquire: %w", ctx.Err())
	}
	if err != nil {
		return 0, n.p.ctxErr(ctx, "acquire", err)
	}
	g := n.p.parseGrant(r, nil)
	switch g.kind {
	case grantHeld:
		return 0, &driver.HeldError{Remaining: g.pttl}
	case grantCreated, grantExisting:
		return g.token, nil
	}
	return 0, g.err
}

// grantKind classifies an AcquireScript reply.
type grantKind int

const (
	grantUnknown  grantKind = iota // no reply, an error or a malformed reply
	grantCreated                   // this call made a new grant
	grantExisting                  // owner already held the lock; nothing created
	grantHeld                      // another owner holds the lock
)

// grant is a parsed AcquireScript reply.
type grant struct {
	kind  grantKind
	token uint64        // grantCreated, grantExisting
	pttl  time.Duration // grantHeld
	err   error         // grantUnknown
}

// parseGrant parses an AcquireScript reply (see its doc) or the call's
// error.
func (p prefix) parseGrant(v any, err error) grant {
	if err != nil {
		return grant{err: err}
	}
	switch x := v.(type) {
	case int64:
		return grant{kind: grantHeld, pttl: time.Duration(x) * time.Millisecond}
	case string:
		t, err := p.parseToken(x)
		if err != nil {
			return grant{err: err}
		}
		return grant{kind: grantCreated, token: t}
	case []any:
		if len(x) == 1 {
			t, err := p.parseToken(x[0])
			if err != nil {
				return grant{err: err}
			}
			return grant{kind: grantExisting, token: t}
		}
	}
	return grant{err: p.errorf("acquire: unexpected reply %v", v)}
}

// detachedTimeout bounds a call that outlives its caller's ctx.
func (n *Node) detachedTimeout() time.Duration { return max(n.o.NodeTimeout, 10*time.Second) }

// cleanup deletes the grant of lock to owner with token, made by an
// acquire whose caller gave up (CleanupScript: nothing else is deleted).
func (n *Node) cleanup(lock, ch, owner string, token uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), n.detachedTimeout())
	defer cancel()
	ql, qz := QueueKeys(lock)
	_, _ = n.c.Run(ctx, CleanupScript, []string{lock, ql, qz}, owner, ch, WakeChannel(n.o.Prefix, ""), strconv.FormatUint(token, 10))
}

// run calls c.Run (c.Ping if s is nil) and returns promptly once ctx is done, even if the
// client does not watch ctx (the call then finishes in the background).
func (n *Node) run(ctx context.Context, s *Script, keys []string, args ...string) (any, error) {
	if ctx.Done() == nil {
		return n.call(ctx, s, keys, args)
	}
	j := newJob(ctx, s, keys, args, false)
	n.start(j)
	select {
	case <-j.done:
		return j.result()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Refresh implements driver.Locker: one EVALSHA of RefreshScript; ErrNotHeld
// if owner does not hold key (an expired lock is never revived). A refresh
// to a shorter TTL than the lock had left tells its waiters (see
// RefreshScript).
func (n *Node) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := n.check(ctx, key, owner, ttl, true, true); err != nil {
		return err
	}
	c := refreshCall(n.o.Prefix, key, owner, ttlMS(n.Capabilities(), ttl))
	r, err := n.run(ctx, RefreshScript, c.Keys, c.Args...)
	return n.p.refreshed(ctx, r, err)
}

// Release implements driver.Locker: one EVALSHA of ReleaseScript, which
// also publishes on the key's channel; ErrNotHeld if owner does not hold key.
func (n *Node) Release(ctx context.Context, key, owner string) error {
	if err := n.check(ctx, key, owner, 0, false, true); err != nil {
		return err
	}
	lock := LockKey(n.o.Prefix, key)
	ch := lock
	ql, qz := QueueKeys(lock)
	r, err := n.run(ctx, ReleaseScript, []string{lock, ql, qz}, owner, ch, WakeChannel(n.o.Prefix, ""))
	if err != nil {
		return n.p.ctxErr(ctx, "release", err)
	}
	if v, _ := asInt(r); v != 1 {
		return n.p.errorf("release: %w", driver.ErrNotHeld)
	}
	return nil
}

// Inspect implements driver.Inspector: one EVALSHA of InspectScript;
// ErrNotHeld if key is free.
func (n *Node) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := n.check(ctx, key, "", 0, false, false); err != nil {
		return driver.Info{}, err
	}
	lock := LockKey(n.o.Prefix, key)
	r, err := n.run(ctx, InspectScript, []string{lock})
	if err != nil {
		return driver.Info{}, n.p.ctxErr(ctx, "inspect", err)
	}
	return n.p.parseInfo(r)
}

func (p prefix) parseInfo(r any) (driver.Info, error) {
	if r == nil {
		return driver.Info{}, p.errorf("inspect: %w", driver.ErrNotHeld)
	}
	a, ok := r.([]any)
	if !ok || len(a) != 3 {
		return driver.Info{}, p.errorf("inspect: unexpected reply %v", r)
	}
	owner, _ := a[0].(string)
	tok, err := p.parseToken(a[1])
	if err != nil {
		return driver.Info{}, err
	}
	pttl, _ := asInt(a[2])
	if pttl == -2 {
		return driver.Info{}, p.errorf("inspect: %w", driver.ErrNotHeld)
	}
	return driver.Info{Owner: owner, Token: tok, Remaining: time.Duration(pttl) * time.Millisecond}, nil
}

// Ping implements driver.Pinger.
func (n *Node) Ping(ctx context.Context) error {
	if n.closed.Load() {
		return n.p.errorf("%w", driver.ErrClosed)
	}
	if _, err := n.run(ctx, nil, nil); err != nil {
		return n.p.ctxErr(ctx, "ping", err)
	}
	return nil
}

// enter registers a call that Close waits for (with its clean-ups, see
// background); exit ends it. ok is false once Close has begun.
func (n *Node) enter() (exit func(), ok bool) {
	n.closeMu.Lock()
	defer n.closeMu.Unlock()
	if n.closed.Load() {
		return nil, false
	}
	n.bg.Add(1)
	return n.bg.Done, true
}

// Close ends waiting AcquireWait calls (driver.ErrClosed; each leaves the
// queue first), gives them and the clean-ups of abandoned acquires up to a
// second, and closes the Conn (if it owns its client). It is idempotent;
// later calls of every method return driver.ErrClosed.
func (n *Node) Close() error {
	n.closeMu.Lock()
	already := n.closed.Swap(true)
	n.closeMu.Unlock()
	if already {
		return nil
	}
	close(n.done)
	idle := make(chan struct{})
	go func() {
		n.bg.Wait()
		close(idle)
	}()
	t := time.NewTimer(time.Second)
	select {
	case <-idle:
	case <-t.C:
	}
	t.Stop()
	return n.c.Close()
}
