package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// counting wraps a driver.Locker and records its acquire attempts (Acquire
// and AcquireWait calls): how many, and when the last one started or ended.
//
// It has every optional interface of package driver but BlockingAcquirer,
// and forwards each to the wrapped driver when that has it. When the driver
// lacks one, the method answers as the contract lets a driver that has it
// answer when it cannot serve, which package locker treats exactly as the
// interface's absence: Subscribe and WatchHold return an error (locker
// then waits on its backoff schedule, and relies on renewal alone), Inspect
// an error matching errors.ErrUnsupported (as locker.Inspect reports for a
// driver without Inspector), Capabilities the zero value (the documented
// meaning of no Capable), Ping nil (what locker.Ping does without a
// Pinger), RefreshBatch each item's Refresh, side by side, as package
// locker renews without it. BlockingAcquirer is the one interface whose presence changes
// how package locker waits, so countingBlocking adds it when the wrapped
// driver has it: two types, however many optional interfaces there are.
type counting struct {
	driver.Locker
	mu       sync.Mutex
	attempts int
	last     time.Time // when an attempt last started or ended
}

var errNotImplemented = errors.New("conformance: the wrapped driver does not implement this interface")

// state reports how many attempts were made and when one last started or
// ended.
func (c *counting) state() (int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.attempts, c.last
}

// track records the start of an attempt and returns the function that
// records its end.
func (c *counting) track() func() {
	c.mu.Lock()
	c.attempts++
	c.last = time.Now()
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		c.last = time.Now()
		c.mu.Unlock()
	}
}

func (c *counting) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	defer c.track()()
	return c.Locker.Acquire(ctx, key, owner, ttl)
}

func (c *counting) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if w, ok := c.Locker.(driver.Waiter); ok {
		return w.Subscribe(ctx, key)
	}
	return nil, nil, fmt.Errorf("subscribe: %w", errNotImplemented)
}

func (c *counting) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	if w, ok := c.Locker.(driver.HoldWatcher); ok {
		return w.WatchHold(key, owner, token, lost)
	}
	return nil, fmt.Errorf("watch hold: %w", errNotImplemented)
}

func (c *counting) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if in, ok := c.Locker.(driver.Inspector); ok {
		return in.Inspect(ctx, key)
	}
	return driver.Info{}, fmt.Errorf("inspect: %w: %w", errNotImplemented, errors.ErrUnsupported)
}

func (c *counting) Capabilities() driver.Capabilities {
	if cp, ok := c.Locker.(driver.Capable); ok {
		return cp.Capabilities()
	}
	return driver.Capabilities{}
}

func (c *counting) Ping(ctx context.Context) error {
	if p, ok := c.Locker.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *counting) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	if br, ok := c.Locker.(driver.BatchRefresher); ok {
		return br.RefreshBatch(ctx, items)
	}
	errs := make([]error, len(items))
	var wg sync.WaitGroup
	for i, it := range items {
		wg.Go(func() { errs[i] = c.Locker.Refresh(ctx, it.Key, it.Owner, it.TTL) })
	}
	wg.Wait()
	return errs
}

type countingBlocking struct{ *counting }

func (c countingBlocking) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	defer c.track()()
	return c.Locker.(driver.BlockingAcquirer).AcquireWait(ctx, key, owner, ttl)
}

// count wraps d; the result has the optional interfaces d has (see
// counting).
func count(d driver.Locker) (driver.Locker, *counting) {
	c := &counting{Locker: d}
	if _, ok := d.(driver.BlockingAcquirer); ok {
		return countingBlocking{c}, c
	}
	return c, c
}

// Compile-time checks: counting has every optional interface but
// BlockingAcquirer, which countingBlocking adds.
var (
	_ interface {
		driver.Waiter
		driver.HoldWatcher
		driver.Inspector
		driver.Capable
		driver.Pinger
		driver.BatchRefresher
	} = (*counting)(nil)
	_ driver.BlockingAcquirer = countingBlocking{}
)
