package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/go-locker/locker"
)

// limitFlag is --limit: run or inspect a semaphore of n permits instead of a
// mutex. Unset means the mutex; a value below 1 or above
// locker.MaxSemaphoreLimit is a usage error (exit 125) before any I/O.
type limitFlag struct {
	n   int
	set bool
}

func (f *limitFlag) String() string {
	if !f.set {
		return "unset"
	}
	return strconv.Itoa(f.n)
}

func (f *limitFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want a number of holders, 1 to %d", locker.MaxSemaphoreLimit)
	}
	if n < 1 || n > locker.MaxSemaphoreLimit {
		return fmt.Errorf("must be 1 to %d, got %d", locker.MaxSemaphoreLimit, n)
	}
	f.n, f.set = n, true
	return nil
}

const limitUsage = "at most `N` runs at once: take one of N permits of the semaphore KEY instead of the lock KEY (1 to 1024)"

// tryAcquire makes one attempt at the lock, or at a permit with --limit.
func (o *runOpts) tryAcquire(ctx context.Context, l *locker.Locker, opts []locker.Option) (*locker.Lock, error) {
	if o.limit.set {
		return l.Semaphore(o.key, o.limit.n).TryAcquire(ctx, opts...)
	}
	return l.TryAcquire(ctx, o.key, opts...)
}

// acquireWait waits for the lock, or for a permit with --limit.
func (o *runOpts) acquireWait(ctx context.Context, l *locker.Locker, opts []locker.Option) (*locker.Lock, error) {
	if o.limit.set {
		return l.Semaphore(o.key, o.limit.n).Acquire(ctx, opts...)
	}
	return l.Acquire(ctx, o.key, opts...)
}

// logWaiting says, under -v, what the run is waiting for.
func (o *runOpts) logWaiting(ctx context.Context, l *locker.Locker) {
	if o.limit.set {
		if hs, err := l.Semaphore(o.key, o.limit.n).Inspect(ctx); err == nil {
			o.logf("waiting for a permit of %q (%d of %d held)", o.key, len(hs), o.limit.n)
			return
		}
		o.logf("waiting for a permit of %q", o.key)
		return
	}
	if in, err := l.Inspect(ctx, o.key); err == nil {
		o.logf("waiting for %q (held with token %d, expires in %v)", o.key, in.Token, in.Remaining.Round(time.Millisecond))
		return
	}
	o.logf("waiting for %q", o.key)
}

// holderJSON is one holder in locker status --limit -o json.
type holderJSON struct {
	Holder      string `json:"holder"`
	Token       uint64 `json:"token"`
	RemainingMS int64  `json:"remaining_ms"`

	remaining time.Duration
}

// statusLimit inspects the semaphore of n on key, fills res and returns
// the exit code as status does: exitOK held, exitFree free.
func (c *common) statusLimit(key string, n int, res *statusJSON) int {
	fail := func(err error) int {
		res.Error = oneLine(err.Error())
		c.errorf("status: %v", err)
		return failCode(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
	defer cancel()
	l, err := c.open(ctx)
	if err != nil {
		return fail(err)
	}
	defer l.Close()
	res.Reachable = true
	hs, err := l.Semaphore(key, n).Inspect(ctx)
	switch {
	case errors.Is(err, errors.ErrUnsupported):
		return fail(fmt.Errorf("the %s backend has no semaphores yet: %w", scheme(c.url), err))
	case err != nil:
		code := fail(err)
		res.Reachable = code != exitUnavailable
		return code
	}
	res.Limit = new(n)
	res.Held = new(len(hs) > 0)
	res.Holders = make([]holderJSON, len(hs))
	for i, h := range hs {
		res.Holders[i] = holderJSON{Holder: h.Owner, Token: h.Token, RemainingMS: h.Remaining.Milliseconds(), remaining: h.Remaining}
	}
	if len(hs) == 0 {
		return exitFree
	}
	return exitOK
}

// printHolders is the text output of locker status --limit.
func printHolders(w io.Writer, res *statusJSON) {
	if len(res.Holders) == 0 {
		fmt.Fprintf(w, "%q is free (0 of %d permits held)\n", res.Key, *res.Limit)
		return
	}
	fmt.Fprintf(w, "key      %s\npermits  %d of %d held\n", res.Key, len(res.Holders), *res.Limit)
	for _, h := range res.Holders {
		fmt.Fprintf(w, "holder   %s token %d expires in %v\n", h.Holder, h.Token, h.remaining.Round(time.Millisecond))
	}
}
