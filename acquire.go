package locker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"

	"github.com/go-locker/locker/driver"
)

// TryAcquire makes one attempt to take key. It returns ErrNotAcquired if
// another owner holds it. ctx bounds the attempt only, never the life of the
// returned lock. The lock is renewed in the background unless
// WithAutoRenew(false) is given; release it with Lock.Release.
//
// Errors: ErrInvalid for an empty key or a bad option (before any I/O),
// ErrNotAcquired, ErrClosed, ErrUnavailable when the backend cannot be
// reached, ctx.Err() wrapped, or the driver's error.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return l.acquire(ctx, key, opts, false)
}

// Acquire takes key, waiting as long as ctx allows while another owner holds
// it. ctx bounds the wait only, never the life of the returned lock.
//
// Waiting does not poll where the driver can do better: it blocks in the
// server (driver.BlockingAcquirer) or waits for a release notification
// (driver.Waiter), with a wake-up when the holder's TTL runs out so a crashed
// holder is taken over promptly. Otherwise it retries with a jittered, capped
// backoff. Within one Locker only one caller per key waits on the backend at
// a time; the others queue locally, in order, so a release costs the server
// O(1) commands whatever the number of waiters.
//
// Fairness: callers of one Locker waiting for one key are served in order.
// Across processes it depends on the backend: Redis on a single server, a
// Cluster or Sentinel queues waiting processes on the server and grants
// them in arrival order (drivers/redis, Fairness; fair=false turns that
// off), and so does etcd, where a TryAcquire may still take a key that is
// free while others wait; elsewhere a caller that arrives just as the key
// is released may take it before a process that has been waiting (as with
// sync.Mutex).
//
// The first attempt fails fast: an unreachable backend (ErrUnavailable) is
// an error at once. Once waiting, a transient error (ErrUnavailable, a
// dropped connection, a leader election) does not end the wait: it is
// retried with backoff until ctx is done, and the error then returned wraps
// ctx.Err() and the last such error.
//
// Errors: those of TryAcquire except ErrNotAcquired; when ctx ends first, an
// error wrapping ctx.Err(); ErrClosed if the Locker is closed meanwhile. A
// failed or cancelled Acquire leaves nothing held.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...Option) (*Lock, error) {
	return l.acquire(ctx, key, opts, true)
}

// acquire is TryAcquire (wait false) and Acquire (wait true), with their
// span and locker.acquire.duration around them.
func (l *Locker) acquire(ctx context.Context, key string, opts []Option, wait bool) (*Lock, error) {
	t := l.tel
	var op acquireOp
	if t != nil {
		ctx, op = t.startAcquire(ctx, key, wait)
	}
	var lk *Lock
	o, err := l.prepare(key, opts)
	if err == nil {
		o.attrs = op.attrs
		lk, err = l.acquireTracked(ctx, key, o, wait)
	}
	err = wrap(ctx, "acquire", key, err)
	if t != nil {
		t.endAcquire(ctx, op, lk, err)
	}
	return lk, err
}

// acquireTracked runs the acquire as a call in flight, which Close cuts
// short and waits for (see Locker.begin).
func (l *Locker) acquireTracked(ctx context.Context, key string, o options, wait bool) (*Lock, error) {
	cctx, done, err := l.begin(ctx, l.life)
	if err != nil {
		return nil, err
	}
	var lk *Lock
	if wait {
		lk, err = l.acquireWait(cctx, key, o)
	} else {
		lk, _, err = l.attempt(cctx, key, o)
	}
	return lk, done(err)
}

// prepare validates key and options before any I/O and applies the driver's
// TTL rounding.
func (l *Locker) prepare(key string, opts []Option) (options, error) {
	if err := l.checkKey(key); err != nil {
		return options{}, err
	}
	o, err := buildOptions(opts)
	if err != nil {
		return o, err
	}
	o.ttl = l.caps.RoundTTL(o.ttl)
	if o.owner == "" {
		o.owner = newOwner()
	}
	return o, nil
}

func newOwner() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand doc)
	return hex.EncodeToString(b[:])
}

// attempt makes one driver Acquire. On success the Lock is tracked and its
// renewal started. It also returns the holder's remaining TTL when the driver
// reported it.
func (l *Locker) attempt(ctx context.Context, key string, o options) (*Lock, time.Duration, error) {
	start := time.Now()
	dctx, end := l.tel.child(ctx, "locker.driver.acquire")
	token, err := l.drv.Acquire(dctx, key, o.owner, o.ttl)
	end(err)
	if err != nil {
		var held *driver.HeldError
		if errors.As(err, &held) {
			return nil, held.Remaining, err
		}
		if !errors.Is(err, ErrNotAcquired) && !o.ownerSet {
			// The reply was lost or the call was cut short: the grant may
			// have happened. The owner is ours alone, so an owner-checked
			// release is always safe and leaves nothing behind.
			l.cleanupKey(key, o.owner)
		}
		return nil, 0, err
	}
	lk, err := l.adoptAt(key, o, token, start, time.Now())
	return lk, 0, err
}

// adoptAt turns a grant into a tracked Lock and starts its deadline and
// renewal. start is when the call the safe deadline counts from was sent
// (the granting call, or a refresh right after it); granted is when the
// grant was known, at the latest (when the granting call returned).
func (l *Locker) adoptAt(key string, o options, token uint64, start, granted time.Time) (*Lock, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.cleanupKey(key, o.owner)
		return nil, ErrClosed
	}
	lk := newLock(l, key, o, token, start, granted)
	l.held[lk] = struct{}{}
	l.mu.Unlock()
	lk.watch(l.watcher)
	return lk, nil
}

// cleanupKey releases key for owner (see cleanup). A Release that fails
// without an answer from the backend (a node timeout while the network is
// cut) is tried again, after a growing pause, until the clean-up's timeout
// or until Close begins: the lost grant must not stay until its TTL.
func (l *Locker) cleanupKey(key, owner string) {
	l.cleanup(func(ctx context.Context) {
		pause := cleanupRetryMin
		for {
			err := l.drv.Release(ctx, key, owner)
			if err == nil || errors.Is(err, ErrNotHeld) || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalid) || l.isClosed() {
				return
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			}
			pause = min(2*pause, cleanupRetryMax)
		}
	})
}

// The pauses between the tries of a clean-up Release.
const (
	cleanupRetryMin = 50 * time.Millisecond
	cleanupRetryMax = 500 * time.Millisecond
)

// cleanup runs fn, a clean-up on the server, in the background with its
// own 5s timeout. Close waits for it before it closes the driver; once the
// driver is closed it is not run.
func (l *Locker) cleanup(fn func(context.Context)) {
	if l.enter(true) {
		l.cleanupEntered(fn)
	}
}

// cleanupEntered is cleanup once enter(true) has succeeded; it calls exit.
func (l *Locker) cleanupEntered(fn func(context.Context)) {
	go func() {
		defer l.exit()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fn(ctx)
	}()
}

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

// acquireWait is Acquire: an attempt, then, once this caller has the turn
// among the Locker's waiters for key (takeTurn), one of three ways to
// wait: blocked in the server (acquireBlocking), woken by the driver's
// notification (waitNotified), or polling (waitPolling).
func (l *Locker) acquireWait(ctx context.Context, key string, o options) (*Lock, error) {
	// A driver that waits in its server needs no separate first attempt:
	// AcquireWait returns at once when the key is free.
	if l.blocking == nil {
		lk, _, err := l.attempt(ctx, key, o)
		if err == nil || !errors.Is(err, ErrNotAcquired) {
			return lk, err
		}
		l.tel.waitEvent(ctx, "locker")
	}
	q, leave, err := l.takeTurn(ctx, key)
	if err != nil {
		return nil, err
	}
	defer leave()
	if l.blocking != nil {
		return l.acquireBlocking(ctx, key, o)
	}
	if err := l.subscribe(ctx, key, q); err != nil {
		return nil, err
	}
	if q.wake != nil {
		return l.waitNotified(ctx, key, o, q)
	}
	return l.waitPolling(ctx, key, o, q)
}

// takeTurn queues the caller behind the Locker's other waiters for key and
// returns once it is their turn; leave ends the turn and leaves the queue.
func (l *Locker) takeTurn(ctx context.Context, key string) (*keyQueue, func(), error) {
	q := l.joinQueue(key)
	select {
	case q.turn <- struct{}{}:
	case <-ctx.Done():
		l.leaveQueue(key, q)
		return nil, nil, ctx.Err()
	case <-l.closing:
		l.leaveQueue(key, q)
		return nil, nil, ErrClosed
	}
	return q, func() {
		<-q.turn
		l.leaveQueue(key, q)
	}, nil
}

// subscribe starts the driver's notifications for key, if it has a Waiter
// and the queue has none yet. A subscription that fails leaves q.wake nil:
// the wait then polls rather than fail.
func (l *Locker) subscribe(ctx context.Context, key string, q *keyQueue) error {
	if l.waiter == nil || q.wake != nil {
		return nil
	}
	wake, cancel, err := l.waiter.Subscribe(ctx, key)
	switch {
	case err == nil:
		q.wake, q.cancel = wake, cancel
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return nil
}

// waitState is what a waiting caller that makes its own attempts carries
// from one to the next.
type waitState struct {
	delay   time.Duration // the next backoff delay
	lastErr error         // the last transient error while waiting
}

// backoff returns the current backoff delay and doubles the next one, up to
// backoffMax.
func (w *waitState) backoff() time.Duration {
	d := w.delay
	w.delay = min(2*w.delay, backoffMax)
	return d
}

// try makes one attempt with the turn. done reports that the wait is over,
// with lk or err. Otherwise remaining is the holder's remaining TTL if the
// driver said, and transient that the attempt failed for a reason other
// than a holder.
func (l *Locker) try(ctx context.Context, key string, o *options, q *keyQueue, w *waitState) (lk *Lock, remaining time.Duration, transient, done bool, err error) {
	// Signals that arrived before this attempt are answered by it.
	drain(q.wake)
	drain(q.local)
	lk, rem, err := l.attempt(ctx, key, *o)
	switch {
	case err == nil:
		l.heldHere(q, true)
		return lk, 0, false, true, nil
	case errors.Is(err, ErrNotAcquired):
		return nil, rem, false, false, nil
	case ctx.Err() != nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalid):
		return nil, 0, false, true, err
	}
	// A transient failure while waiting (a dropped connection, a leader
	// election): keep waiting, with backoff. The attempt is being cleaned
	// up in the background, so the next one uses a fresh owner that
	// clean-up cannot touch.
	w.lastErr = err
	if !o.ownerSet {
		o.owner = newOwner()
	}
	return nil, 0, true, false, nil
}

// waitNotified waits with the driver's notifications: after each attempt
// it sleeps until a wake-up, a release through this Locker, the holder's
// TTL, or a fallback timer in case a notification was lost.
func (l *Locker) waitNotified(ctx context.Context, key string, o options, q *keyQueue) (*Lock, error) {
	w := waitState{delay: backoffMin}
	for skip := l.heldHere(q, false); ; skip = false {
		var remaining time.Duration
		transient := false
		if !skip {
			lk, rem, tr, done, err := l.try(ctx, key, &o, q, &w)
			if done {
				return lk, err
			}
			remaining, transient = rem, tr
		}
		wait := fallbackMax
		if transient {
			wait = w.backoff()
		}
		if err := l.pause(ctx, q, untilExpiry(jitter(wait), remaining), w.lastErr); err != nil {
			return nil, err
		}
	}
}

// waitPolling waits without notifications: it retries with a jittered,
// capped backoff, and just after the holder's TTL runs out where the driver
// reports it (a *HeldError, or Inspect).
func (l *Locker) waitPolling(ctx context.Context, key string, o options, q *keyQueue) (*Lock, error) {
	w := waitState{delay: backoffMin}
	for skip := l.heldHere(q, false); ; skip = false {
		var remaining time.Duration
		if !skip {
			lk, rem, _, done, err := l.try(ctx, key, &o, q, &w)
			if done {
				return lk, err
			}
			remaining = rem
		}
		wait := w.backoff()
		if remaining <= 0 && l.inspector != nil {
			if in, ierr := l.inspector.Inspect(ctx, key); ierr == nil {
				remaining = in.Remaining
			}
		}
		if err := l.pause(ctx, q, untilExpiry(jitter(wait), remaining), w.lastErr); err != nil {
			return nil, err
		}
	}
}

// untilExpiry shortens wait to just after the holder's remaining TTL, so a
// crashed holder is taken over at TTL plus a few milliseconds.
func untilExpiry(wait, remaining time.Duration) time.Duration {
	if remaining > 0 && remaining+expirySlack < wait {
		return remaining + expirySlack + mrand.N(expirySlack)
	}
	return wait
}

// pause sleeps for wait, or until a wake-up or a local release. It
// returns an error when ctx ends (with lastErr, the last transient error
// while waiting, if any) or the Locker closes.
func (l *Locker) pause(ctx context.Context, q *keyQueue, wait time.Duration, lastErr error) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-q.wake:
	case <-q.local:
	case <-t.C:
	case <-ctx.Done():
		if lastErr != nil {
			return fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), lastErr)
		}
		return ctx.Err()
	case <-l.closing:
		return ErrClosed
	}
	return nil
}

// acquireBlocking waits in the server. Close cuts the wait short (ctx is
// cut by Locker.begin). The lock's max and min hold count from when
// AcquireWait returned: the grant came at some unknown moment of the wait,
// and that is the latest it can have been, so the bounds are never shorter
// than from the grant.
func (l *Locker) acquireBlocking(ctx context.Context, key string, o options) (*Lock, error) {
	l.tel.waitEvent(ctx, "server")
	for {
		start := time.Now()
		dctx, end := l.tel.child(ctx, "locker.driver.acquire_wait")
		token, err := l.blocking.AcquireWait(dctx, key, o.owner, o.ttl)
		end(err)
		granted := time.Now()
		if err != nil {
			if !o.ownerSet && !errors.Is(err, ErrNotAcquired) {
				l.cleanupKey(key, o.owner)
			}
			return nil, err
		}
		if granted.Sub(start) > o.ttl/4 {
			// The server counts the TTL from the grant, at some unknown
			// point of a long wait: count the safe deadline from a refresh
			// instead of from the start of the wait.
			start = time.Now()
			dctx, end := l.tel.child(ctx, "locker.driver.refresh")
			err := l.drv.Refresh(dctx, key, o.owner, o.ttl)
			end(err)
			if err != nil {
				if errors.Is(err, ErrNotHeld) {
					continue // it expired already (this process was paused): wait again
				}
				if !o.ownerSet {
					l.cleanupKey(key, o.owner)
				}
				return nil, err
			}
		}
		return l.adoptAt(key, o, token, start, granted)
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
	return d*8/10 + mrand.N(d*4/10+1)
}

// isClosed reports whether Close has begun.
func (l *Locker) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}
