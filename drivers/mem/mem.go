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
package mem

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
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

// Open returns a Locker on the store named by dsn: "" or "mem://" for the
// default store, "mem://NAME" for a named one. Errors wrap driver.ErrInvalid.
func (Driver) Open(dsn string) (driver.Locker, error) {
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
	return s.Locker(), nil
}

func parseDSN(dsn string) (string, error) {
	if dsn == "" {
		return "", nil
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("mem: %w: malformed URL", driver.ErrInvalid)
	}
	switch {
	case u.Scheme != "mem":
		return "", fmt.Errorf("mem: %w: scheme %q, want mem://", driver.ErrInvalid, u.Scheme)
	case u.Opaque != "" || u.User != nil || u.Port() != "" || (u.Path != "" && u.Path != "/") || u.Fragment != "":
		return "", fmt.Errorf("mem: %w: want mem:// or mem://NAME, nothing else", driver.ErrInvalid)
	case u.RawQuery != "":
		return "", fmt.Errorf("mem: %w: unknown query parameters %q (mem takes none)", driver.ErrInvalid, u.RawQuery)
	}
	return u.Host, nil
}

// Store is an in-memory lock server. Its methods are safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	locks   map[string]*entry
	counter uint64
	subs    map[string]map[chan struct{}]struct{}
	shared  map[sharedID]*sharedLock // semaphores and RW locks (shared.go)
}

type entry struct {
	owner   string
	token   uint64
	expires time.Time // carries a monotonic reading
	timer   *time.Timer
}

// NewStore returns an empty store, private to the caller.
func NewStore() *Store {
	return &Store{locks: map[string]*entry{}, subs: map[string]map[chan struct{}]struct{}{}}
}

// Locker returns a new client of the store; each behaves like a separate
// process. It implements driver.Locker, driver.Waiter, driver.Inspector,
// driver.Capable and driver.SharedLocker.
func (s *Store) Locker() driver.Locker { return &conn{s: s} }

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

// dropLocked deletes key and wakes its subscribers. s.mu is held.
func (s *Store) dropLocked(key string, e *entry) {
	e.timer.Stop()
	delete(s.locks, key)
	for ch := range s.subs[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

func (s *Store) expire(key string, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks[key] == e && !time.Now().Before(e.expires) {
		s.dropLocked(key, e)
	}
}

type conn struct {
	s      *Store
	mu     sync.Mutex
	closed bool
}

func (c *conn) check(ctx context.Context, key string) error {
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

// Acquire implements driver.Locker.
func (c *conn) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
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

// Refresh implements driver.Locker.
func (c *conn) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := c.check(ctx, key); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
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
	e.expires = now.Add(ttl)
	e.timer.Reset(ttl)
	return nil
}

// Release implements driver.Locker.
func (c *conn) Release(ctx context.Context, key, owner string) error {
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

// Inspect implements driver.Inspector.
func (c *conn) Inspect(ctx context.Context, key string) (driver.Info, error) {
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
func (c *conn) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
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
func (c *conn) Capabilities() driver.Capabilities {
	return driver.Capabilities{DurableTokens: true}
}

// Ping implements driver.Pinger.
func (c *conn) Ping(ctx context.Context) error { return c.check(ctx, "-") }

// Close implements driver.Locker. Locks taken through c stay in the store
// until released or expired, as on a real server. Closing twice is a no-op.
func (c *conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}
