// Package tablelock is a complete locker driver for a toy backend: a Table
// of leases in memory, standing in for your lock server. Each method does
// what the server would do in one atomic request.
package tablelock

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

func init() { locker.Register("tablelock", Driver{}) }

// Driver opens Lockers for locker.Open and locker.OpenURL.
type Driver struct{}

// Open takes "tablelock://NAME": every Open of one NAME shares one Table.
func (Driver) Open(dsn string) (driver.Locker, error) {
	return Open(context.Background(), dsn)
}

var (
	tablesMu sync.Mutex
	tables   = map[string]*Table{}
)

// Open returns a Locker on the Table named by dsn ("tablelock://NAME").
func Open(ctx context.Context, dsn string) (*Locker, error) {
	u, err := url.Parse(dsn)
	if err != nil || u.Scheme != "tablelock" || u.Host == "" {
		return nil, fmt.Errorf("tablelock: bad URL %q: %w", dsn, driver.ErrInvalid)
	}
	tablesMu.Lock()
	defer tablesMu.Unlock()
	if tables[u.Host] == nil {
		tables[u.Host] = NewTable()
	}
	return New(ctx, tables[u.Host], nil)
}

// Options configures a Locker; nil means the defaults.
type Options struct{}

// New returns a Locker on t, the client the program already has.
func New(ctx context.Context, t *Table, opts *Options) (*Locker, error) {
	return &Locker{t: t}, nil
}

// Table is the lock server: one lease per key, and a token counter per key
// that outlives the leases.
type Table struct {
	mu     sync.Mutex
	leases map[string]lease
	tokens map[string]uint64
}

type lease struct {
	owner   string
	token   uint64
	expires time.Time
}

// NewTable returns an empty Table.
func NewTable() *Table {
	return &Table{leases: map[string]lease{}, tokens: map[string]uint64{}}
}

// Locker is a driver.Locker on a Table.
type Locker struct {
	t      *Table
	closed atomic.Bool
}

func (l *Locker) check(ctx context.Context, key string, ttl time.Duration, withTTL bool) error {
	switch {
	case l.closed.Load():
		return fmt.Errorf("tablelock: %w", driver.ErrClosed)
	case ctx.Err() != nil:
		return fmt.Errorf("tablelock: %w", ctx.Err())
	case key == "":
		return fmt.Errorf("tablelock: empty key: %w", driver.ErrInvalid)
	case withTTL && ttl <= 0:
		return fmt.Errorf("tablelock: ttl %v: %w", ttl, driver.ErrInvalid)
	}
	return nil
}

// held returns key's lease if it is in force. The caller holds t.mu.
func (t *Table) held(key string, now time.Time) (lease, bool) {
	ls, ok := t.leases[key]
	return ls, ok && now.Before(ls.expires)
}

// Acquire takes key for owner, or tells how long the holder has left.
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := l.check(ctx, key, ttl, true); err != nil {
		return 0, err
	}
	t, now := l.t, time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if ls, ok := t.held(key, now); ok {
		if ls.owner != owner {
			return 0, &driver.HeldError{Remaining: ls.expires.Sub(now)}
		}
		ls.expires = now.Add(ttl) // idempotent: same owner, same token
		t.leases[key] = ls
		return ls.token, nil
	}
	t.tokens[key]++ // strictly increasing per key, never reset
	t.leases[key] = lease{owner: owner, token: t.tokens[key], expires: now.Add(ttl)}
	return t.tokens[key], nil
}

// Refresh resets the ttl of a lease owner holds; an expired one stays expired.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := l.check(ctx, key, ttl, true); err != nil {
		return err
	}
	t, now := l.t, time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	ls, ok := t.held(key, now)
	if !ok || ls.owner != owner {
		return fmt.Errorf("tablelock: refresh %q: %w", key, driver.ErrNotHeld)
	}
	ls.expires = now.Add(ttl)
	t.leases[key] = ls
	return nil
}

// Release frees a lease owner holds.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	if err := l.check(ctx, key, 0, false); err != nil {
		return err
	}
	t := l.t
	t.mu.Lock()
	defer t.mu.Unlock()
	ls, ok := t.held(key, time.Now())
	if !ok || ls.owner != owner {
		return fmt.Errorf("tablelock: release %q: %w", key, driver.ErrNotHeld)
	}
	delete(t.leases, key)
	return nil
}

// Close makes every later call return driver.ErrClosed.
func (l *Locker) Close() error {
	l.closed.Store(true)
	return nil
}
