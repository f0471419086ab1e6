package locker

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

var (
	driversMu sync.RWMutex
	drivers   = map[string]driver.Driver{}
)

// Register makes a driver available under name, which is also the URL scheme
// OpenURL maps to it. Drivers call it from an init function. It panics if d is
// nil, name is empty, or name is already registered.
func Register(name string, d driver.Driver) {
	if d == nil {
		panic("locker: Register driver is nil")
	}
	if name == "" {
		panic("locker: Register with an empty name")
	}
	driversMu.Lock()
	defer driversMu.Unlock()
	if _, dup := drivers[name]; dup {
		panic("locker: Register called twice for driver " + name)
	}
	drivers[name] = d
}

// Drivers returns the sorted names of the registered drivers.
func Drivers() []string {
	driversMu.RLock()
	defer driversMu.RUnlock()
	names := make([]string, 0, len(drivers))
	for n := range drivers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Open opens a Locker with the driver registered as driverName; dsn is in the
// driver's own format (every driver in this module takes a URL). opts set
// where metrics, spans and logs go (see OpenOption); metrics and spans carry
// locker.driver = driverName. An unregistered name fails with an error that
// hints at a forgotten import. Errors from the driver are wrapped; a
// malformed dsn or an unknown query parameter matches ErrInvalid, a backend
// the driver checks at open and cannot reach matches ErrUnavailable. The dsn
// itself is never part of an error, so passwords do not leak into logs.
func Open(driverName, dsn string, opts ...OpenOption) (*Locker, error) {
	driversMu.RLock()
	d, ok := drivers[driverName]
	driversMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("locker: unknown driver %q (forgotten import?)", driverName)
	}
	dl, err := d.Open(dsn)
	if err != nil {
		// Drivers name themselves in their errors ("redis: …").
		return nil, fmt.Errorf("locker: open: %w", err)
	}
	if dl == nil {
		return nil, fmt.Errorf("locker: open %s: driver returned no Locker", driverName)
	}
	return newLocker(dl, driverName, opts), nil
}

// OpenURL opens a Locker with the driver registered under the URL's scheme,
// passing it the whole URL: for example "mem://", "redis://host:6379/0",
// "etcd://h1:2379,h2:2379/prefix" or "postgres://user@host/db". A malformed
// URL fails with ErrInvalid; an unknown scheme fails with an error that lists
// the registered drivers. opts are those of Open.
func OpenURL(rawURL string, opts ...OpenOption) (*Locker, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL itself may hold a password
		}
		return nil, fmt.Errorf("locker: malformed URL: %w: %w", ErrInvalid, err)
	}
	if u.Scheme == "" {
		return nil, fmt.Errorf("locker: malformed URL: %w: no scheme (want e.g. mem://, redis://host:6379)", ErrInvalid)
	}
	scheme := strings.ToLower(u.Scheme)
	driversMu.RLock()
	_, ok := drivers[scheme]
	driversMu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("locker: unknown driver %q for URL scheme (registered: %s; forgotten import?)",
			scheme, strings.Join(Drivers(), ", "))
	}
	return Open(scheme, rawURL, opts...)
}

// Locker hands out locks on one backend. It is safe for concurrent use; one
// Locker per backend and process is the intended use, as with *sql.DB.
type Locker struct {
	drv       driver.Locker
	caps      driver.Capabilities
	waiter    driver.Waiter
	blocking  driver.BlockingAcquirer
	inspector driver.Inspector
	watcher   driver.HoldWatcher
	changes   driver.ChangeWatcher
	batch     *batcher   // nil unless the driver is a driver.BatchRefresher
	sched     *scheduler // the locks' deadlines, max holds and renewals (sched.go)
	tel       *telemetry // nil: no instrumentation at all

	// closing is closed, and life cancelled with cause ErrClosed, when
	// Close begins: waits and calls in flight are cut short. grace is
	// cancelled once Close has released the locks it holds: a Release
	// still in flight then is cut short too.
	closing     chan struct{}
	closeDone   chan struct{} // closed when Close has finished
	life, grace context.Context
	endLife     context.CancelCauseFunc
	endGrace    context.CancelCauseFunc
	// doneLife and doneGrace are begin's done for a context that is never
	// done, made once (beginUncancellable).
	doneLife, doneGrace func(error) error

	mu     sync.Mutex
	closed bool
	// busy counts the calls and clean-ups that use the driver (see enter).
	// Close closes the driver once it is zero; from then on, shut is set
	// and nothing enters.
	busy   int
	idle   chan struct{} // closed when busy falls to zero; nil if nobody waits
	shut   bool
	held   map[*Lock]struct{}
	queues map[string]*keyQueue
}

// New returns a Locker that uses d, for example a driver built from a client
// the program already has. Optional driver interfaces (driver.Waiter,
// driver.BlockingAcquirer, driver.HoldWatcher, driver.Inspector,
// driver.Capable, driver.BatchRefresher) are discovered by type assertion. opts set where
// metrics, spans and logs go (see OpenOption); metrics and spans carry
// locker.driver = "custom". The Locker owns d: Close closes it. New panics
// if d is nil.
func New(d driver.Locker, opts ...OpenOption) *Locker {
	if d == nil {
		panic("locker: New with a nil driver.Locker")
	}
	return newLocker(d, "custom", opts)
}

func newLocker(d driver.Locker, driverName string, opts []OpenOption) *Locker {
	var c config
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	l := &Locker{
		tel:       newTelemetry(driverName, c),
		drv:       d,
		closing:   make(chan struct{}),
		closeDone: make(chan struct{}),
		held:      map[*Lock]struct{}{},
		queues:    map[string]*keyQueue{},
		sched:     newScheduler(),
	}
	l.life, l.endLife = context.WithCancelCause(context.Background())
	l.grace, l.endGrace = context.WithCancelCause(context.Background())
	l.doneLife = func(err error) error { return l.doneCut(l.life, err) }
	l.doneGrace = func(err error) error { return l.doneCut(l.grace, err) }
	if c, ok := d.(driver.Capable); ok {
		l.caps = c.Capabilities()
	}
	l.waiter, _ = d.(driver.Waiter)
	l.blocking, _ = d.(driver.BlockingAcquirer)
	l.inspector, _ = d.(driver.Inspector)
	l.watcher, _ = d.(driver.HoldWatcher)
	l.changes, _ = d.(driver.ChangeWatcher)
	if br, ok := d.(driver.BatchRefresher); ok {
		l.batch = newBatcher(l, br)
	}
	return l
}

// Driver returns the driver.Locker underneath, for optional interfaces and
// tests. Calling its Close closes it under the Locker's feet; use Close.
func (l *Locker) Driver() driver.Locker { return l.drv }

// Capabilities returns what the driver reports about itself: minimum TTL and
// its granularity, token durability. The zero value if it reports nothing.
func (l *Locker) Capabilities() driver.Capabilities { return l.caps }

// Do takes key (waiting as Acquire does), runs fn, and releases the lock when
// fn returns or panics. fn's context is cancelled the moment the lock is lost;
// its context.Cause is then the Lock's Err: it matches ErrNotHeld and the
// LostCause. fn should stop touching the protected resource when its context
// is done. Do returns fn's error; if the lock was lost while fn ran, the error
// also matches ErrNotHeld and the LostCause, even when fn returned nil. The
// release runs with a 5s timeout that ctx's cancellation does not cut short;
// under WithMinHold it leaves the key taken until the bound.
func (l *Locker) Do(ctx context.Context, key string, fn func(context.Context) error, opts ...Option) (err error) {
	lk, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	return doHeld(ctx, lk, fn)
}

// doHeld runs fn under lk, with a context cancelled (cause: lk.Err()) when
// lk is lost, and releases lk when fn returns or panics: Do, and the Do
// methods of semaphores and read-write locks.
func doHeld(ctx context.Context, lk *Lock, fn func(context.Context) error) (err error) {
	fctx, cancel := context.WithCancelCause(ctx)
	stopWatch := make(chan struct{})
	go func() {
		select {
		case <-lk.Lost():
			cancel(lk.Err())
		case <-stopWatch:
		}
	}()
	finish := func() error {
		close(stopWatch)
		cancel(nil)
		select {
		case <-lk.Lost():
			return prefix("do", lk.key, fmt.Errorf("lock lost while fn ran: %w", lk.Err()))
		default:
		}
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		return lk.Release(rctx)
	}
	defer func() {
		if r := recover(); r != nil {
			_ = finish()
			panic(r)
		}
	}()
	ferr := fn(fctx)
	if rerr := finish(); rerr != nil {
		return errors.Join(ferr, rerr)
	}
	return ferr
}

// Info describes the current holder of a key, as Inspect reports it.
type Info struct {
	// Owner is the holder's owner string.
	Owner string
	// Token is the fencing token of the current grant.
	Token uint64
	// Remaining is the TTL the lock has left, as the server sees it.
	Remaining time.Duration
	// Kind is the kind of hold: "mutex" from Locker.Inspect, "semaphore"
	// from Semaphore.Inspect, "read" or "write" from RWMutex.Inspect.
	Kind string
}

// Inspect reports who holds key, without changing anything. It returns
// ErrNotHeld if the key is free, and an error matching errors.ErrUnsupported
// if the driver cannot inspect.
func (l *Locker) Inspect(ctx context.Context, key string) (Info, error) {
	if err := l.checkKey(key); err != nil {
		return Info{}, wrap(ctx, "inspect", key, err)
	}
	if l.inspector == nil {
		return Info{}, wrap(ctx, "inspect", key, fmt.Errorf("driver %T cannot inspect: %w", l.drv, errors.ErrUnsupported))
	}
	cctx, done, err := l.begin(ctx, l.life)
	if err != nil {
		return Info{}, wrap(ctx, "inspect", key, err)
	}
	in, err := l.inspector.Inspect(cctx, key)
	if err = done(err); err != nil {
		return Info{}, wrap(ctx, "inspect", key, err)
	}
	return Info{Owner: in.Owner, Token: in.Token, Remaining: in.Remaining, Kind: "mutex"}, nil
}

// Ping checks that the backend is reachable, where the driver can tell
// (driver.Pinger); otherwise it only checks that the Locker is open.
func (l *Locker) Ping(ctx context.Context) error {
	cctx, done, err := l.begin(ctx, l.life)
	if err != nil {
		return wrap(ctx, "ping", "", err)
	}
	if p, ok := l.drv.(driver.Pinger); ok {
		err = p.Ping(cctx)
	}
	return wrap(ctx, "ping", "", done(err))
}

// Close shuts the Locker down, and returns once nothing of it touches the
// backend any more. It cuts short the calls in flight that wait or may
// wait (Acquire, TryAcquire, Do's acquire, Lock.Refresh, Inspect, Ping):
// they return an error matching ErrClosed, never ErrUnavailable, and a
// grant one of them won meanwhile is released, owner-checked. It releases
// every lock still held through this Locker (each with a 5s timeout,
// honouring WithMinHold; their Lost channels close with CauseClosed, since
// their holders no longer hold them, and Do's fn sees its context
// cancelled); a Release already in flight is waited for within that
// timeout, and retried if it failed, and is cut short after it. Close then
// waits for every such call, and for the owner-checked clean-ups of grants
// whose fate was unknown, to finish, and closes the driver last: no grant
// made before or during Close outlives it on the server, unless the
// backend could not be reached within those timeouts (the lock then
// expires after its TTL). Close does not wait for Do's fn, which it cannot
// stop.
//
// Close is idempotent and safe to call from several goroutines: a later
// call waits until the first has finished, and returns nil. Every other
// method returns an error matching ErrClosed afterwards.
func (l *Locker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.closeDone
		return nil
	}
	defer close(l.closeDone)
	l.closed = true
	close(l.closing)
	l.endLife(ErrClosed)
	held := make([]*Lock, 0, len(l.held))
	for lk := range l.held {
		held = append(held, lk)
	}
	l.mu.Unlock()

	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	for _, lk := range held {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := lk.release(ctx, &lostError{cause: CauseClosed, msg: "the Locker was closed"})
			if err != nil && !errors.Is(err, ErrNotHeld) {
				errMu.Lock()
				errs = append(errs, wrap(ctx, "close: release", lk.key, err))
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	l.endGrace(ErrClosed)
	l.waitIdle()
	l.sched.stop()
	if err := l.drv.Close(); err != nil && !errors.Is(err, ErrClosed) {
		errs = append(errs, fmt.Errorf("locker: close: %w", err))
	}
	return errors.Join(errs...)
}

// enter registers a use of the driver: a call of the API (open: only while
// the Locker is open) or a clean-up (once Close has begun too, until it
// closes the driver). It reports false when that is no longer allowed.
// Every true is matched by one exit.
func (l *Locker) enter(cleanup bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shut || (l.closed && !cleanup) {
		return false
	}
	l.busy++
	return true
}

func (l *Locker) exit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.busy--
	if l.busy == 0 && l.idle != nil {
		close(l.idle)
		l.idle = nil
	}
}

// waitIdle waits until no use of the driver is under way, and then bars
// new ones.
func (l *Locker) waitIdle() {
	for {
		l.mu.Lock()
		if l.busy == 0 {
			l.shut = true
			l.mu.Unlock()
			return
		}
		if l.idle == nil {
			l.idle = make(chan struct{})
		}
		idle := l.idle
		l.mu.Unlock()
		<-idle
	}
}

// begin registers a call of the API in flight (see enter), or returns
// ErrClosed. The context it returns is ctx, cut short with cause ErrClosed
// when cut is done (l.life: when Close begins; l.grace: once Close has
// released its locks). done ends the call; it returns err, or ErrClosed in
// its place when the call failed after being cut short, so that a driver's
// report of a connection closed under it never reaches the caller.
func (l *Locker) begin(ctx context.Context, cut context.Context) (context.Context, func(error) error, error) {
	if !l.enter(false) {
		return ctx, nil, ErrClosed
	}
	if ctx.Done() == nil {
		return l.beginUncancellable(ctx, cut)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(cut, func() { cancel(ErrClosed) })
	return cctx, func(err error) error {
		stop()
		if err != nil && errors.Is(context.Cause(cctx), ErrClosed) &&
			(!errors.Is(err, ErrClosed) || errors.Is(err, ErrUnavailable)) {
			err = errCutShort
		}
		cancel(nil)
		l.exit()
		return err
	}, nil
}

// beginUncancellable is begin for a ctx that is never done (Background,
// WithoutCancel): the call's context is cut itself where ctx carries no
// values (it is context.Background()), and otherwise ctx's values with
// cut's cancellation; done is made once per Locker. Nothing is allocated
// for context.Background().
func (l *Locker) beginUncancellable(ctx, cut context.Context) (context.Context, func(error) error, error) {
	done := l.doneLife
	if cut == l.grace {
		done = l.doneGrace
	}
	if ctx == context.Background() {
		return cut, done, nil
	}
	return cutCtx{Context: ctx, cut: cut}, done, nil
}

// doneCut is the done of beginUncancellable: as begin's, where the call
// was cut short if cut is done (ctx never is).
func (l *Locker) doneCut(cut context.Context, err error) error {
	if err != nil && cut.Err() != nil && (!errors.Is(err, ErrClosed) || errors.Is(err, ErrUnavailable)) {
		err = errCutShort
	}
	l.exit()
	return err
}

// cutCtx is a context that is never done itself with the cancellation of
// cut: ctx's values, cut's Done, Err and Cause.
type cutCtx struct {
	context.Context
	cut context.Context
}

func (c cutCtx) Deadline() (time.Time, bool) { return c.cut.Deadline() }
func (c cutCtx) Done() <-chan struct{}       { return c.cut.Done() }
func (c cutCtx) Err() error                  { return c.cut.Err() }

// Value is ctx's, except what context.Cause looks up, which is cut's.
func (c cutCtx) Value(key any) any {
	if v := c.Context.Value(key); v != nil {
		return v
	}
	return c.cut.Value(key)
}

// errCutShort is what a call cut short by Close returns.
var errCutShort = fmt.Errorf("%w: Close cut the call short", ErrClosed)

// maxKeyLen bounds keys for every backend; drivers may accept less.
const maxKeyLen = 4096

func (l *Locker) checkKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalid)
	}
	if len(key) > maxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalid, len(key), maxKeyLen)
	}
	return nil
}

func (l *Locker) untrack(lk *Lock) {
	l.mu.Lock()
	delete(l.held, lk)
	l.mu.Unlock()
}
