package rediscore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// prefix is the driver name every error of the core starts with: "redis"
// (drivers/redis, and the default) or "rueidis".
type prefix string

// errorf is fmt.Errorf with "<p>: " in front of format.
func (p prefix) errorf(format string, a ...any) error {
	return fmt.Errorf(string(p)+": "+format, a...)
}

// Waiter is the waiting half a driver supplies to its Locker: pub/sub,
// client-side-caching invalidations, or both, for one deployment or N
// Redlock masters.
type Waiter interface {
	// Subscribe returns once a wait on lock (the lock key) or channel (its
	// pub/sub channel, see Keys) is effective on the server: wake then
	// receives a value whenever the lock may have become free. cancel ends
	// the wait and may be called more than once. Errors wrap ctx.Err() once
	// ctx is done, or driver.ErrClosed after Shut.
	Subscribe(ctx context.Context, lock, channel string) (wake <-chan struct{}, cancel func(), err error)
	// Shut ends every wait (waiters are woken once). Locker.Close calls it
	// once.
	Shut()
}

// LockerConfig is what a driver builds a Locker from.
type LockerConfig struct {
	// Name starts every error the Locker returns: "redis" or "rueidis".
	Name string
	// Conns is the one deployment (a single node, a Cluster or a
	// Sentinel-managed master: the Locker runs a Node), or the N >= 2
	// independent masters of a Redlock.
	Conns []Conn
	// Options are the options in effect; zero fields take their defaults.
	// They are not validated here (see CheckOptions and ParseURL).
	Options Options
	// Waiter serves Subscribe; it must not be nil.
	Waiter Waiter
	// Hold, when not nil, serves WatchHold. Without it WatchHold returns
	// an error saying "<Name>: hold watching needs <HoldNeeds>".
	Hold      *HoldWatch
	HoldNeeds string
	// WaiterAfterConns makes Close shut the Waiter after closing the Conns
	// rather than before: for a Waiter whose in-flight reads go through the
	// Conns' clients, which then fail at once instead of running to their
	// timeout.
	WaiterAfterConns bool
	// Listener, when not nil, wakes the fair queue's waiters (see
	// Node.AcquireWait): a single deployment then queues waiting acquires
	// unless Options.Barging. If it has a Shut method, Close calls it
	// before closing the Conns.
	Listener Listener
	// Sharded says the one deployment is a Cluster, where PUBLISH counts
	// only the subscribers of the node that runs it: the fair queue then
	// cannot tell that a waiter's process is gone, and relies on its
	// entry's expiry alone (see QueueAcquireScript).
	Sharded bool
}

// backend is what Node and Redlock implement.
type backend interface {
	driver.Locker
	driver.BatchRefresher
	driver.Inspector
	driver.Capable
	driver.Pinger
}

// Locker is a complete Redis driver.Locker over a driver's connections: a
// Node (one deployment) or a Redlock (N masters), with waiting (Subscribe,
// over the driver's Waiter), hold watching (WatchHold, over a HoldWatch),
// Inspect, Capabilities and Ping. It implements driver.Locker,
// driver.Inspector, driver.Capable, driver.Pinger, driver.Waiter,
// driver.HoldWatcher and driver.BatchRefresher. Every error it returns starts with the driver's name.
// It is safe for concurrent use.
//
// Each driver's own Locker wraps one and declares the same methods,
// delegating to it.
type Locker struct {
	p       prefix
	node    *Node    // one deployment; nil under Redlock
	redlock *Redlock // N masters; nil for one deployment
	b       backend  // node or redlock
	opts    Options  // defaults applied
	waiter  Waiter
	hold    *HoldWatch
	cfg     LockerConfig

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Interfaces are the driver interfaces Locker implements; each driver
// asserts its own Locker against it.
type Interfaces interface {
	driver.Locker
	driver.Inspector
	driver.Capable
	driver.Pinger
	driver.Waiter
	driver.HoldWatcher
	driver.BlockingAcquirer
	driver.SharedLocker
	driver.SharedRefuser
	driver.BatchRefresher
}

var _ Interfaces = (*Locker)(nil)

// Opened is a driver's Driver.Open over its Open: the *Locker as a
// driver.Locker, or a nil interface (never a typed nil) with the error.
func Opened[L driver.Locker](l L, err error) (driver.Locker, error) {
	if err != nil {
		return nil, err
	}
	return l, nil
}

// NewLocker returns a Locker over cfg: a Node when cfg.Conns holds one
// Conn, a Redlock when it holds several. It makes no round trip. Close
// closes the HoldWatch, the Waiter and every Conn.
func NewLocker(cfg LockerConfig) *Locker {
	o := cfg.Options.WithDefaults()
	l := &Locker{p: prefix(cfg.Name), opts: o, waiter: cfg.Waiter, hold: cfg.Hold, cfg: cfg}
	if len(cfg.Conns) == 1 {
		l.node = NewNode(cfg.Conns[0], o)
		l.node.p = l.p
		if cfg.Listener != nil {
			l.node.SetListener(cfg.Listener)
		}
		l.node.sharded = cfg.Sharded
		l.b = l.node
	} else {
		l.redlock = NewRedlock(cfg.Conns, o)
		l.redlock.p = l.p
		l.b = l.redlock
	}
	if l.hold != nil {
		l.hold.mu.Lock()
		l.hold.p = l.p
		l.hold.mu.Unlock()
	}
	return l
}

// Acquire implements driver.Locker: one round trip (AcquireScript: SET NX
// PX and the fencing token) on one deployment, the Redlock algorithm over
// N masters (see Redlock.Acquire). Another owner's lock: a
// *driver.HeldError with the holder's remaining TTL. An empty or oversized
// key, an empty owner or a non-positive ttl wrap driver.ErrInvalid; after
// Close, driver.ErrClosed; a done ctx, ctx.Err().
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return l.b.Acquire(ctx, key, owner, ttl)
}

// AcquireWait implements driver.BlockingAcquirer: it waits until key is
// granted to owner. On one deployment with a Listener the waiters queue on
// the server and are granted in arrival order, a release waking only the
// next (Node.AcquireWait); with Options.Barging, without a Listener and
// under Redlock every waiter is woken through Subscribe and the first to
// retry wins (BargeWait). A free key costs one round trip, as Acquire.
// Errors as for Acquire, except that another owner holding key is not one:
// ctx bounds the wait, and its end returns an error wrapping ctx.Err()
// (and the last transient error while waiting), leaving nothing held or
// queued. The first attempt's error is returned at once; later transient
// errors are retried with backoff.
func (l *Locker) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	sub := func(ctx context.Context) (<-chan struct{}, func(), error) { return l.Subscribe(ctx, key) }
	if l.node != nil {
		return l.node.AcquireWait(ctx, key, owner, ttl, sub)
	}
	return l.p.bargeWait(ctx, func(ctx context.Context) (uint64, error) { return l.Acquire(ctx, key, owner, ttl) }, sub)
}

// Refresh implements driver.Locker: driver.ErrNotHeld if owner does not
// hold key; an expired lock is never revived.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return l.b.Refresh(ctx, key, owner, ttl)
}

// Release implements driver.Locker: driver.ErrNotHeld if owner does not
// hold key. The release publishes on the key's channel and deletes the key
// (which invalidates it in every client tracking it), waking waiters. A
// hold watch of key by owner through this Locker reports nothing for it.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	if l.hold == nil {
		return l.b.Release(ctx, key, owner)
	}
	r := l.hold.Releasing(key, owner)
	err := l.b.Release(ctx, key, owner)
	r.Done(err)
	return err
}

// Inspect implements driver.Inspector: driver.ErrNotHeld if key is free.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return l.b.Inspect(ctx, key)
}

// Capabilities implements driver.Capable: MinTTL 10ms (Redlock: 3 ×
// node_timeout), millisecond granularity, tokens that survive a restart of
// the server (floored at its clock).
func (l *Locker) Capabilities() driver.Capabilities { return l.b.Capabilities() }

// Ping implements driver.Pinger: one round trip (Redlock: a quorum must
// answer within node_timeout).
func (l *Locker) Ping(ctx context.Context) error { return l.b.Ping(ctx) }

// Subscribe implements driver.Waiter over the driver's Waiter: from its
// return, wake receives a value whenever key's lock may have become free.
// Errors: driver.ErrInvalid for a bad key, driver.ErrClosed after Close,
// ctx.Err() wrapped once ctx is done, or the server's error.
func (l *Locker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if l.closed.Load() {
		return nil, nil, l.p.errorf("%w", driver.ErrClosed)
	}
	if err := l.p.checkKey(key, l.opts.MaxKeyLen); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, l.p.errorf("subscribe: %w", err)
	}
	lock := LockKey(l.opts.Prefix, key)
	channel := lock
	wake, cancel, err := l.waiter.Subscribe(ctx, lock, channel)
	if err != nil {
		if errors.Is(err, driver.ErrClosed) {
			return nil, nil, l.p.errorf("%w", driver.ErrClosed)
		}
		return nil, nil, err
	}
	return wake, cancel, nil
}

// WatchHold implements driver.HoldWatcher over the HoldWatch: lost is
// called when key is deleted, evicted, expires or is overwritten by
// another grant; the Locker's own refreshes and release are not reported.
// Without a HoldWatch it returns an error naming what hold watching needs.
// Errors: driver.ErrClosed after Close.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	if l.closed.Load() {
		return nil, l.p.errorf("%w", driver.ErrClosed)
	}
	if l.hold == nil {
		return nil, errors.New(string(l.p) + ": hold watching needs " + l.cfg.HoldNeeds)
	}
	return l.hold.Watch(key, owner, token, lost)
}

// WatchChanges implements driver.ChangeWatcher over the HoldWatch (see
// HoldWatch.WatchChanges). Without a HoldWatch it returns an error naming
// what it needs, matching errors.ErrUnsupported. Errors: driver.ErrInvalid
// for a bad key; driver.ErrClosed after Close; ctx.Err() (wrapped) if ctx
// is done.
func (l *Locker) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if l.closed.Load() {
		return nil, l.p.errorf("%w", driver.ErrClosed)
	}
	if err := l.p.checkKey(key, l.opts.MaxKeyLen); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, l.p.errorf("watch changes: %w", err)
	}
	if l.hold == nil {
		return nil, l.p.errorf("watching changes needs %s: %w", l.cfg.HoldNeeds, errors.ErrUnsupported)
	}
	return l.hold.WatchChanges(key, changed)
}

// Close ends every hold watch and every wait (waiters are woken once) and
// closes the Conns (which close the clients they own). It is idempotent;
// later calls of the other methods return driver.ErrClosed.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		if l.hold != nil {
			l.hold.Close()
		}
		if !l.cfg.WaiterAfterConns {
			l.waiter.Shut()
		}
		if s, ok := l.cfg.Listener.(interface{ Shut() }); ok {
			s.Shut()
		}
		l.closeErr = l.b.Close()
		if l.cfg.WaiterAfterConns {
			l.waiter.Shut()
		}
	})
	return l.closeErr
}

// CheckOptions returns o, the Options a driver's New, NewRedlock (or
// rueidis's NewWithClientOption) got, validated and with defaults applied.
// Errors start with name and wrap driver.ErrInvalid: a field out of range
// (see Options.Validate).
func CheckOptions(name string, o Options) (Options, error) {
	if err := o.validate(prefix(name)); err != nil {
		return o, err
	}
	return o.WithDefaults(), nil
}

// Adopted checks the arguments of a driver's New (one client) or, with
// redlock, NewRedlock (at least 2 clients, one per master), and returns
// the options as CheckOptions does. Errors start with name and wrap
// driver.ErrInvalid: invalid options, too few clients, a nil client.
func Adopted[C any](name string, redlock bool, clients []C, o Options) (Options, error) {
	o, err := CheckOptions(name, o)
	if err != nil {
		return o, err
	}
	p := prefix(name)
	if redlock && len(clients) < 2 {
		return o, p.errorf("Redlock needs at least 2 clients, got %d: %w", len(clients), driver.ErrInvalid)
	}
	for i, c := range clients {
		switch {
		case any(c) != nil:
		case redlock:
			return o, p.errorf("client %d is nil: %w", i, driver.ErrInvalid)
		default:
			return o, p.errorf("nil client: %w", driver.ErrInvalid)
		}
	}
	return o, nil
}

// Explain returns do with every error passed through explain (a driver's
// wording of connection failures, naming their cause).
func (do DoFunc) Explain(explain func(error) error) DoFunc {
	return func(ctx context.Context, args ...string) (any, error) {
		v, err := do(ctx, args...)
		if err != nil {
			return nil, explain(err)
		}
		return v, nil
	}
}

// CheckMaster runs ROLE through do on the server at addr (a single node or
// a Redlock master): it must answer, and be a master unless allowReplica. A
// replica is refused because a lock written there is rejected (READONLY)
// or, with replica-read-only off, invisible to the master. Errors start
// with name and addr: a failed call (wrapping driver.ErrUnavailable when
// the server could not be reached, see MarkUnavailable), a reply that is
// not ROLE's, or a replica (wrapping driver.ErrInvalid, naming its master
// and allow_replica=true).
func CheckMaster(ctx context.Context, name, addr string, allowReplica bool, do DoFunc) error {
	p := prefix(name)
	v, err := do(ctx, "ROLE")
	if err != nil {
		return MarkUnavailable(p.errorf("%s: ROLE: %w", addr, err))
	}
	a, _ := v.([]any)
	if len(a) == 0 {
		return p.errorf("%s: unexpected ROLE reply %v (is this a Redis server?)", addr, v)
	}
	role, _ := a[0].(string)
	if role == "master" || allowReplica {
		return nil
	}
	what := "a " + role
	if role == "slave" {
		what = "a replica (ROLE slave"
		if len(a) >= 3 {
			what += fmt.Sprintf(" of %v:%v", a[1], a[2])
		}
		what += ")"
	}
	return p.errorf("%s is %s, not a master: locks written there are lost or refused; point the URL at the master, use sentinel_master, or set allow_replica=true: %w",
		addr, what, driver.ErrInvalid)
}

// CheckQuorum is a Redlock Open's start-up check: it runs check(i) for each
// of the n masters in parallel. A failure that retrying will not cure is
// returned as it is (the first in master order): one wrapping
// driver.ErrInvalid (a replica, a bad setting) or ErrEvictionPolicy, or
// one for which fatal (if not nil) reports true. Other failures are
// tolerated as long as a quorum (n/2+1) of masters passed; failing that,
// the error starts with name, names the counts, joins the masters' errors
// and wraps driver.ErrUnavailable.
func CheckQuorum(name string, n int, check func(i int) error, fatal func(error) bool) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = check(i) })
	}
	wg.Wait()
	up := 0
	for _, err := range errs {
		switch {
		case err == nil:
			up++
		case errors.Is(err, driver.ErrInvalid), errors.Is(err, ErrEvictionPolicy), fatal != nil && fatal(err):
			return err
		}
	}
	if q := n/2 + 1; up < q {
		return AsUnavailable(prefix(name).errorf("Redlock: %d of %d masters answered, quorum %d: %w", up, n, q, errors.Join(errs...)))
	}
	return nil
}
