package conformance

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// counting wraps a driver.Locker and counts Acquire calls, exposing exactly
// the waiting interfaces (Waiter, BlockingAcquirer) the wrapped driver has.
type counting struct {
	driver.Locker
	acquires atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	c.acquires.Add(1)
	return c.Locker.Acquire(ctx, key, owner, ttl)
}

func (c *counting) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if in, ok := c.Locker.(driver.Inspector); ok {
		return in.Inspect(ctx, key)
	}
	return driver.Info{}, errors.ErrUnsupported
}

func (c *counting) Capabilities() driver.Capabilities {
	if cp, ok := c.Locker.(driver.Capable); ok {
		return cp.Capabilities()
	}
	return driver.Capabilities{}
}

type countingWaiter struct{ *counting }

func (c countingWaiter) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return c.Locker.(driver.Waiter).Subscribe(ctx, key)
}

type countingBlocking struct{ *counting }

func (c countingBlocking) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	c.acquires.Add(1)
	return c.Locker.(driver.BlockingAcquirer).AcquireWait(ctx, key, owner, ttl)
}

type countingBoth struct{ *counting }

func (c countingBoth) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return countingWaiter(c).Subscribe(ctx, key)
}

func (c countingBoth) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	return countingBlocking(c).AcquireWait(ctx, key, owner, ttl)
}

// count wraps d; the result has d's Waiter and BlockingAcquirer, if any.
func count(d driver.Locker) (driver.Locker, *counting) {
	c := &counting{Locker: d}
	_, w := d.(driver.Waiter)
	_, b := d.(driver.BlockingAcquirer)
	switch {
	case w && b:
		return countingBoth{c}, c
	case w:
		return countingWaiter{c}, c
	case b:
		return countingBlocking{c}, c
	}
	return c, c
}
