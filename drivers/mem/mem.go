// Package mem is the in-process reference driver for package locker,
// registered as "mem".
//
// A Store plays the lock server: TTLs expire on the monotonic clock, fencing
// tokens come from one counter per store that never goes backwards, waiters
// are woken by release and by expiry (driver.Waiter), and the holder can be
// inspected (driver.Inspector). A Refresh or Release by an owner that does
// not hold the key fails with driver.ErrNotHeld, which, when another owner
// holds the key, also matches driver.ErrNotAcquired (a *driver.HeldError):
// package locker then reports the loss as locker.CauseTaken. It passes the conformance suite and powers the
// examples. It coordinates goroutines of one process only.
//
// URLs:
//
//	mem://       the process-wide default store
//	mem://NAME   the store called NAME, created on first use
//
// Every Open of the same store shares it, so several lockers on one store
// behave like separate processes talking to one server. Any other part in
// the URL (user, port, path, query) is an error wrapping driver.ErrInvalid.
//
// In Go code, Open(ctx, "mem://NAME") returns a *Locker of that store
// (Open(ctx, "") or "mem://" the default store), and New(ctx, s, opts) a
// *Locker of a store s the caller made with NewStore (NewStore().Locker()
// is the same): a nil s is an error wrapping driver.ErrInvalid, and
// Options has no fields yet, so nil means the defaults.
//
// mem is the reference implementation of shared holds
// (driver.SharedLocker), behind package locker's Semaphore and RWMutex: a
// store keeps each semaphore and read-write lock apart from the mutex on
// the same key, serves their waiters in arrival order, and wakes only the
// waiters it can grant; a waiting writer blocks the reads that arrive
// after it.
package mem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/dsn"
)

var (
	_ driver.Locker    = (*Locker)(nil)
	_ driver.Waiter    = (*Locker)(nil)
	_ driver.Inspector = (*Locker)(nil)
	_ driver.Capable   = (*Locker)(nil)
	_ driver.Pinger    = (*Locker)(nil)

	_ driver.BatchRefresher = (*Locker)(nil)
)

func init() {
	locker.Register("mem", Driver{})
}

// Driver opens lockers on in-memory stores. Its zero value is ready to use.
type Driver struct{}

var (
	storesMu sync.Mutex
	stores   = map[string]*Store{}
)

// Open calls the package-level Open with context.Background().
func (Driver) Open(dsn string) (driver.Locker, error) {
	return Open(context.Background(), dsn)
}

// Open returns a Locker on the store named by dsn: "" or "mem://" for the
// process-wide default store, "mem://NAME" for the store called NAME,
// created on first use. It makes no I/O; ctx is not kept.
//
// Errors: anything else in dsn (user, port, path, query, fragment, another
// scheme) wraps driver.ErrInvalid.
func Open(ctx context.Context, dsn string) (*Locker, error) {
	name, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	storesMu.Lock()
	s := stores[name]
	if s == nil {
		s = NewStore()
		stores[name] = s
	}
	storesMu.Unlock()
	return &Locker{s: s}, nil
}

// Options configures New. It has no fields yet: nil and &Options{} are
// the same, and mean the defaults.
type Options struct{}

// New returns a new client of the store s, like s.Locker(): each client
// behaves like a separate process talking to one server. It makes no I/O;
// ctx is not kept.
//
// Errors: a nil s wraps driver.ErrInvalid.
func New(ctx context.Context, s *Store, opts *Options) (*Locker, error) {
	if s == nil {
		return nil, dsn.Invalid("mem", "nil store")
	}
	return &Locker{s: s}, nil
}

func parseDSN(raw string) (string, error) {
	if raw == "" {
		return "", nil
	}
	u, err := dsn.Parse("mem", raw, "mem://", "mem")
	if err != nil {
		return "", err
	}
	if u.Opaque != "" || u.User != nil || u.Port() != "" || (u.Path != "" && u.Path != "/") {
		return "", dsn.Invalid("mem", "want mem:// or mem://NAME, nothing else")
	}
	q, err := dsn.NewQuery("mem", u)
	if err != nil {
		return "", err
	}
	return u.Host, q.Done()
}

// Store is an in-memory lock server. Its methods are safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	locks   map[string]*entry
	counter uint64
	subs    map[string]map[chan struct{}]struct{}
	changes map[string]map[*changeWatch]struct{} // WatchChanges watches by key (changes.go)
	shared  map[sharedID]*sharedLock             // semaphores and RW locks (shared.go)
}

type entry struct {
	owner   string
	token   uint64
	expires time.Time // carries a monotonic reading
	timer   *time.Timer
}

// NewStore returns an empty store, private to the caller.
func NewStore() *Store {
	return &Store{locks: map[string]*entry{}, subs: map[string]map[chan struct{}]struct{}{}, changes: map[string]map[*changeWatch]struct{}{}}
}

// Locker returns a new client of the store, a *Locker; each behaves like a
// separate process. It is New(ctx, s, nil) without the error. It implements
// driver.Locker, driver.Waiter, driver.ChangeWatcher, driver.Inspector,
// driver.Capable and driver.SharedLocker.
func (s *Store) Locker() driver.Locker { return &Locker{s: s} }

// live returns key's entry if it has not expired. s.mu is held.
func (s *Store) live(key string, now time.Time) *entry {
	e := s.locks[key]
	if e == nil {
		return nil
	}
	if !now.Before(e.expires) {
		s.dropLocked(key, e)
		return nil
	}
	return e
}

// dropLocked deletes key and wakes its subscribers and change watchers.
// s.mu is held.
func (s *Store) dropLocked(key string, e *entry) {
	e.timer.Stop()
	delete(s.locks, key)
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s.changedLocked(key)
}

// changedLocked tells key's change watchers. s.mu is held.
func (s *Store) changedLocked(key string) {
	for w := range s.changes[key] {
		w.mark()
	}
}

func (s *Store) expire(key string, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks[key] == e && !time.Now().Before(e.expires) {
		s.dropLocked(key, e)
	}
}

// Locker is a client of a Store. It implements driver.Locker,
// driver.Waiter, driver.ChangeWatcher, driver.Inspector, driver.Capable,
// driver.Pinger and driver.BatchRefresher, and is safe for concurrent use.
type Locker struct {
	s      *Store
	mu     sync.Mutex
	closed bool
}

func (c *Locker) check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("mem: %w", err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return driver.ErrClosed
	}
	if key == "" {
		return fmt.Errorf("mem: %w: empty key", driver.ErrInvalid)
	}
	return nil
}

func checkTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("mem: %w: ttl must be positive, got %v", driver.ErrInvalid, ttl)
	}
	return nil
}

// Acquire takes key for owner for ttl, or resets the ttl and returns the
// same token if owner holds it already. Tokens come from one counter per
// store. Errors: a *driver.HeldError (matching driver.ErrNotAcquired) with
// the holder's remaining TTL if another owner holds key; driver.ErrInvalid
// for an empty key or a ttl that is not positive; driver.ErrClosed after
// Close; ctx.Err() (wrapped) if ctx is done.
func (c *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := c.check(ctx, key); err != nil {
		return 0, err
	}
	if err := checkTTL(ttl); err != nil {
		return 0, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if e := s.live(key, now); e != nil {
		if e.owner != owner {
			return 0, &driver.HeldError{Remaining: e.expires.Sub(now)}
		}
		e.expires = now.Add(ttl)
		e.timer.Reset(ttl)
		return e.token, nil
	}
	s.counter++
	e := &entry{owner: owner, token: s.counter, expires: now.Add(ttl)}
	e.timer = time.AfterFunc(ttl, func() { s.expire(key, e) })
	s.locks[key] = e
	s.changedLocked(key)
	return e.token, nil
}

// notHeld is the error of a Refresh or Release by an owner that does not
// hold key: driver.ErrNotHeld, and, when another owner holds key now, also a
// *driver.HeldError (matching driver.ErrNotAcquired), from which package
// locker reports the loss as locker.CauseTaken. s.mu is held.
func notHeld(e *entry, now time.Time) error {
	if e == nil {
		return driver.ErrNotHeld
	}
	return fmt.Errorf("mem: %w: %w", driver.ErrNotHeld, &driver.HeldError{Remaining: e.expires.Sub(now)})
}

// Refresh resets the ttl of the lock owner holds on key. Errors:
// driver.ErrNotHeld if owner does not hold it, which also matches
// driver.ErrNotAcquired (a *driver.HeldError) when another owner does, otherwise as
// for Acquire.
func (c *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := c.check(ctx, key); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refreshLocked(key, owner, ttl, time.Now())
}

// refreshLocked is Refresh once the arguments are checked. s.mu is held.
func (s *Store) refreshLocked(key, owner string, ttl time.Duration, now time.Time) error {
	e := s.live(key, now)
	if e == nil || e.owner != owner {
		return notHeld(e, now)
	}
	e.expires = now.Add(ttl)
	e.timer.Reset(ttl)
	return nil
}

// RefreshBatch implements driver.BatchRefresher: each item as Refresh,
// all under one lock of the store, with one error per item.
func (c *Locker) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	errs := make([]error, len(items))
	ok := false
	for i, it := range items {
		if errs[i] = c.check(ctx, it.Key); errs[i] == nil {
			errs[i] = checkTTL(it.TTL)
		}
		ok = ok || errs[i] == nil
	}
	if !ok {
		return errs
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for i, it := range items {
		if errs[i] == nil {
			errs[i] = s.refreshLocked(it.Key, it.Owner, it.TTL, now)
		}
	}
	return errs
}

// Release frees key if owner holds it, waking its subscribers. Errors:
// driver.ErrNotHeld (changing nothing) if owner does not hold it, otherwise
// as for Acquire.
func (c *Locker) Release(ctx context.Context, key, owner string) error {
	if err := c.check(ctx, key); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	e := s.live(key, now)
	if e == nil || e.owner != owner {
		return notHeld(e, now)
	}
	s.dropLocked(key, e)
	return nil
}

// Inspect returns the holder of key, its token and remaining TTL, and
// changes nothing. Errors: driver.ErrNotHeld if key is free, otherwise as
// for Acquire.
func (c *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := c.check(ctx, key); err != nil {
		return driver.Info{}, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	e := s.live(key, now)
	if e == nil {
		return driver.Info{}, driver.ErrNotHeld
	}
	return driver.Info{Owner: e.owner, Token: e.token, Remaining: e.expires.Sub(now)}, nil
}

// Subscribe implements driver.Waiter: wake receives a value whenever key is
// released or expires.
func (c *Locker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := c.check(ctx, key); err != nil {
		return nil, nil, err
	}
	s := c.s
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.subs[key] == nil {
		s.subs[key] = map[chan struct{}]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	cancel := func() {
		once.Do(func() {
			s.mu.Lock()
			delete(s.subs[key], ch)
			if len(s.subs[key]) == 0 {
				delete(s.subs, key)
			}
			s.mu.Unlock()
		})
	}
	return ch, cancel, nil
}

// Capabilities implements driver.Capable: any positive TTL is kept exactly,
// and tokens never go backwards for the life of the store.
func (c *Locker) Capabilities() driver.Capabilities {
	return driver.Capabilities{DurableTokens: true}
}

// Ping returns nil, or driver.ErrClosed after Close, or ctx.Err()
// (wrapped) if ctx is done.
func (c *Locker) Ping(ctx context.Context) error { return c.check(ctx, "-") }

// Close implements driver.Locker. Locks taken through c stay in the store
// until released or expired, as on a real server. Closing twice is a no-op.
func (c *Locker) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
