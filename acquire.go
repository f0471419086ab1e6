package locker

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Waiting policy. With a driver.Waiter the timers below are only a fallback
// for a lost notification; without one they are the retry schedule.
const (
	// backoffMin is the first retry delay without a Waiter.
	backoffMin = 5 * time.Millisecond
	// backoffMax caps the retry delay without a Waiter.
	backoffMax = 500 * time.Millisecond
	// fallbackMax caps the wait for a notification with a Waiter.
	fallbackMax = 2 * time.Second
	// expirySlack is added to the holder's remaining TTL so the retry lands
	// just after the server expired the key.
	expirySlack = 2 * time.Millisecond
)

// keyQueue serialises the callers of one Locker waiting for one key, so that
// only the one whose turn it is talks to the backend.
type keyQueue struct {
	refs int           // guarded by Locker.mu
	turn chan struct{} // holds a value while some caller has the turn
	// local is signalled when a lock on this key is released through this
	// Locker, so the next local waiter need not wait for the server's
	// notification.
	local chan struct{}
	// heldLocally is set when a caller that had the turn was granted the
	// key, and cleared when that lock ends: the next caller then waits
	// without a pointless attempt. Guarded by Locker.mu.
	heldLocally bool

	// Owned by whoever has the turn.
	wake   <-chan struct{}
	cancel func()
}

func (l *Locker) joinQueue(key string) *keyQueue {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[key]
	if q == nil {
		q = &keyQueue{turn: make(chan struct{}, 1), local: make(chan struct{}, 1)}
		l.queues[key] = q
	}
	q.refs++
	return q
}

func (l *Locker) leaveQueue(key string, q *keyQueue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q.refs--
	if q.refs == 0 {
		delete(l.queues, key)
		if q.cancel != nil {
			q.cancel()
		}
	}
}

// notifyLocal tells a local waiter on key, if any, that the key was just
// released through this Locker.
func (l *Locker) notifyLocal(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queues[key]
	if q == nil {
		return
	}
	q.heldLocally = false
	select {
	case q.local <- struct{}{}:
	default:
	}
}

// heldHere reports, and marks, whether the key was last granted to a caller
// of this Locker that still holds it.
func (l *Locker) heldHere(q *keyQueue, set bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	was := q.heldLocally
	if set {
		q.heldLocally = true
	}
	return was
}

func (l *Locker) acquireWait(ctx context.Context, key string, o options) (*Lock, error) {
	// A driver that waits in its server needs no separate first attempt:
	// AcquireWait returns at once when the key is free.
	if l.blocking == nil {
		lk, _, err := l.attempt(ctx, key, o)
		if err == nil || !errors.Is(err, ErrNotAcquired) {
			return lk, err
		}
	}

	q := l.joinQueue(key)
	defer l.leaveQueue(key, q)
	select {
	case q.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closing:
		return nil, ErrClosed
	}
	defer func() { <-q.turn }()

	if l.blocking != nil {
		return l.acquireBlocking(ctx, key, o)
	}

	if l.waiter != nil && q.wake == nil {
		wake, cancel, err := l.waiter.Subscribe(ctx, key)
		switch {
		case err == nil:
			q.wake, q.cancel = wake, cancel
		case ctx.Err() != nil:
			return nil, ctx.Err()
		default:
			// The notification channel is unavailable: fall back to the
			// backoff schedule rather than fail the wait.
		}
	}

	delay := backoffMin
	skip := l.heldHere(q, false)
	var lastErr error // the last transient error while waiting
	for {
		var remaining time.Duration
		transient := false
		if !skip {
			// Signals that arrived before this attempt are answered by it.
			drain(q.wake)
			drain(q.local)
			lk, rem, err := l.attempt(ctx, key, o)
			switch {
			case err == nil:
				l.heldHere(q, true)
				return lk, nil
			case errors.Is(err, ErrNotAcquired):
				remaining = rem
			case ctx.Err() != nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalid):
				return nil, err
			default:
				// A transient failure while waiting (a dropped connection,
				// a leader election): keep waiting, with backoff. The
				// attempt is being cleaned up in the background, so the
				// next one uses a fresh owner that clean-up cannot touch.
				lastErr, transient = err, true
				if !o.ownerSet {
					o.owner = newOwner()
				}
			}
		}
		skip = false
		wait := delay
		if q.wake != nil && !transient {
			wait = fallbackMax
		} else {
			delay = min(2*delay, backoffMax)
		}
		if remaining <= 0 && l.inspector != nil && q.wake == nil {
			if in, ierr := l.inspector.Inspect(ctx, key); ierr == nil {
				remaining = in.Remaining
			}
		}
		wait = jitter(wait)
		if remaining > 0 && remaining+expirySlack < wait {
			// Wake just after the holder's TTL runs out, so a crashed
			// holder is taken over at TTL plus a few milliseconds.
			wait = remaining + expirySlack + rand.N(expirySlack)
		}
		t := time.NewTimer(wait)
		select {
		case <-q.wake:
		case <-q.local:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if lastErr != nil {
				return nil, fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), lastErr)
			}
			return nil, ctx.Err()
		case <-l.closing:
			t.Stop()
			return nil, ErrClosed
		}
		t.Stop()
	}
}

// acquireBlocking waits in the server. A Close while waiting cancels the wait.
func (l *Locker) acquireBlocking(ctx context.Context, key string, o options) (*Lock, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-l.closing:
			cancel(ErrClosed)
		case <-ctx.Done():
		}
	}()
	for {
		start := time.Now()
		token, err := l.blocking.AcquireWait(ctx, key, o.owner, o.ttl)
		if err != nil {
			if !o.ownerSet && !errors.Is(err, ErrNotAcquired) {
				l.cleanup(key, o.owner)
			}
			if errors.Is(context.Cause(ctx), ErrClosed) {
				return nil, ErrClosed
			}
			return nil, err
		}
		if time.Since(start) > o.ttl/4 {
			// The grant came at some unknown point of a long wait, and
			// the server counts the TTL from then: count the safe
			// deadline from a refresh instead of from the start of the
			// wait.
			start = time.Now()
			if err := l.drv.Refresh(ctx, key, o.owner, o.ttl); err != nil {
				if errors.Is(err, ErrNotHeld) {
					continue // it expired already (this process was paused): wait again
				}
				if !o.ownerSet {
					l.cleanup(key, o.owner)
				}
				return nil, err
			}
		}
		return l.adopt(key, o, token, start)
	}
}

func drain(ch <-chan struct{}) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// jitter spreads d over [0.8d, 1.2d) so that waiters in different processes do
// not retry in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*8/10 + rand.N(d*4/10+1)
}
