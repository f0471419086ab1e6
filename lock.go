package locker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// safeDeadline returns when the holder must presume a lock lost: start (when
// the last successful acquire or renewal was sent, on the local monotonic
// clock) plus ttl minus the driver's margin (driver.Capabilities.Margin, at
// least TTL/100 + 2ms). The server started counting the TTL no earlier than
// start, so as long as its clock runs no faster than ours by more than the
// margin allows, the holder's Lost fires before the server lets the key go.
func (l *Locker) safeDeadline(start time.Time, ttl time.Duration) time.Time {
	return start.Add(ttl - l.caps.Margin(ttl))
}

type lockState int

const (
	stateHeld lockState = iota
	stateReleased
	stateLost
)

// Lock is a held lock. Its methods are safe for concurrent use.
//
// A Lock is held from the moment Acquire returns it until Release, until
// its owner's Locker is closed, or until it is lost: the server says it is
// gone (expired, taken over, deleted), or the safe local deadline passes
// without a successful renewal. Lost tells you the moment that happens.
//
// No lock can stop a holder that is paused (GC, swap, SIGSTOP) past its TTL
// from resuming and acting as if it still held the lock. Pass Token to the
// resource you protect and have it reject smaller tokens than it has seen:
// that fences off a holder that lost its lock without noticing.
type Lock struct {
	l         *Locker
	key       string
	owner     string
	token     uint64
	autoRenew bool

	io     chan struct{} // serialises refreshes, so the last success is the last applied
	stop   chan struct{} // closed when the lock stops being held
	kick   chan struct{} // tells the renewer a manual Refresh moved the schedule
	done   chan struct{} // closed when the renewer exits; nil without renewal
	ctx    context.Context
	cancel context.CancelFunc // cuts short in-flight renewals

	mu           sync.Mutex
	ttl          time.Duration
	deadline     time.Time
	timer        *time.Timer
	state        lockState
	cause        error // why Lost was closed
	lost         chan struct{}
	releaseRetry bool
	unwatch      func() // ends the driver.HoldWatcher watch; nil if none
}

func newLock(l *Locker, key string, o options, token uint64, start time.Time) *Lock {
	ctx, cancel := context.WithCancel(context.Background())
	lk := &Lock{
		l: l, key: key, owner: o.owner, token: token, autoRenew: o.autoRenew,
		io:   make(chan struct{}, 1),
		stop: make(chan struct{}),
		kick: make(chan struct{}, 1),
		ctx:  ctx, cancel: cancel,
		ttl:      o.ttl,
		deadline: l.safeDeadline(start, o.ttl),
		lost:     make(chan struct{}),
	}
	lk.mu.Lock()
	lk.timer = time.AfterFunc(time.Until(lk.deadline), lk.onDeadline)
	if lk.autoRenew {
		lk.done = make(chan struct{})
		go lk.renewLoop()
	}
	lk.mu.Unlock()
	return lk
}

// Key returns the key the lock is held on.
func (lk *Lock) Key() string { return lk.key }

// Token returns the fencing token of this grant: strictly greater than the
// token of every earlier grant of the same key, across release, expiry and
// re-acquire. Send it with every write to the protected resource and have
// the resource reject a token lower than the highest it has seen.
func (lk *Lock) Token() uint64 { return lk.token }

// TTL returns the TTL in force: the requested one after the driver's
// rounding (see WithTTL), or the one last passed to Refresh.
func (lk *Lock) TTL() time.Duration {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.ttl
}

// Deadline returns the lock's safe deadline as it stands now: the moment
// Lost closes unless a renewal or Refresh succeeds first (the start of the
// last successful acquire or refresh, plus the TTL, minus the drift margin).
// Renewal moves it forward every TTL/3. It carries a monotonic clock
// reading, so time.Until(lk.Deadline()) is immune to wall-clock steps. Once
// the lock has ended it keeps the value it had then.
func (lk *Lock) Deadline() time.Time {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.deadline
}

// Lost returns a channel that is closed when the lock is lost or presumed
// lost: a renewal or Refresh was told the lock is gone, the safe deadline
// passed without a successful renewal, Release found it already gone, the
// Locker was closed, or the driver saw the server end the lock early
// (driver.HoldWatcher). It closes before the server can grant the key to
// anyone else when the lock ends by its TTL, given the drift allowance
// (clocks that differ in rate by under 1%, or the driver's wider margin). It
// is not closed by a successful Release.
func (lk *Lock) Lost() <-chan struct{} { return lk.lost }

// lostCause returns why Lost was closed, an error matching ErrNotHeld.
func (lk *Lock) lostCause() error {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.cause == nil {
		return ErrNotHeld
	}
	return lk.cause
}

// Refresh resets the lock's TTL on the server to ttl, which also becomes the
// TTL automatic renewal uses from then on. ttl is rounded as in WithTTL.
// It returns ErrNotHeld once the lock is released or lost (and then Lost is
// closed), ErrInvalid for a non-positive ttl, or the driver's error, after
// which the lock is still held until its safe deadline passes.
func (lk *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return wrap(ctx, "refresh", lk.key, fmt.Errorf("%w: ttl must be positive, got %v", ErrInvalid, ttl))
	}
	err := lk.refresh(ctx, lk.l.caps.RoundTTL(ttl), false)
	if err == nil {
		select {
		case lk.kick <- struct{}{}:
		default:
		}
	}
	return wrap(ctx, "refresh", lk.key, err)
}

// Release frees the lock on the server and stops its renewal. It returns
// ErrNotHeld if the lock was no longer held (it had been released, lost, or
// taken over), after which Lost is closed. On any other error renewal has
// stopped anyway and the lock expires after its TTL; Release may be called
// again to retry.
func (lk *Lock) Release(ctx context.Context) error {
	return wrap(ctx, "release", lk.key, lk.release(ctx, nil))
}

func (lk *Lock) release(ctx context.Context, closeCause error) error {
	lk.mu.Lock()
	switch lk.state {
	case stateLost:
		cause := lk.cause
		lk.mu.Unlock()
		return cause
	case stateReleased:
		if !lk.releaseRetry {
			lk.mu.Unlock()
			return fmt.Errorf("%w: already released", ErrNotHeld)
		}
	case stateHeld:
		lk.state = stateReleased
		lk.endLocked()
	}
	lk.releaseRetry = false
	lk.mu.Unlock()
	lk.stopWatch()
	if lk.done != nil {
		<-lk.done
	}

	err := lk.l.drv.Release(ctx, lk.key, lk.owner)
	lk.l.untrack(lk)
	switch {
	case err == nil:
		lk.l.notifyLocal(lk.key)
		if closeCause != nil {
			lk.closeLost(closeCause)
		}
	case errors.Is(err, ErrNotHeld):
		err = fmt.Errorf("%w: it had expired or been taken over before Release", ErrNotHeld)
		lk.mu.Lock()
		lk.state = stateLost
		lk.mu.Unlock()
		lk.closeLost(err)
	default:
		lk.mu.Lock()
		lk.releaseRetry = true
		lk.mu.Unlock()
		if closeCause != nil {
			lk.closeLost(closeCause)
		}
	}
	return err
}

// endLocked stops renewal and the deadline timer. lk.mu is held.
func (lk *Lock) endLocked() {
	close(lk.stop)
	lk.cancel()
	lk.timer.Stop()
}

func (lk *Lock) closeLost(cause error) {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.cause == nil {
		lk.cause = cause
		close(lk.lost)
	}
}

// lose marks the lock lost and closes Lost. If the loss is only presumed (the
// deadline passed), an owner-checked release is sent in the background so
// that the key is freed at once if the server still has it.
func (lk *Lock) lose(cause error, releaseOnServer bool) {
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return
	}
	lk.state = stateLost
	lk.endLocked()
	lk.mu.Unlock()
	lk.stopWatch()
	lk.closeLost(cause)
	lk.l.untrack(lk)
	lk.l.notifyLocal(lk.key)
	if releaseOnServer {
		lk.l.cleanup(lk.key, lk.owner)
	}
}

// watch starts the driver's HoldWatcher on this grant, if it has one, so
// that a lock the server ends early (a session that dies, a key deleted or
// overwritten) closes Lost at once. Called without lk.mu or Locker.mu held.
func (lk *Lock) watch(w driver.HoldWatcher) {
	if w == nil {
		return
	}
	stop, err := w.WatchHold(lk.key, lk.owner, lk.token, func(err error) {
		lk.lose(fmt.Errorf("%w: the backend reports it gone: %w", ErrNotHeld, err), false)
	})
	if err != nil {
		return // not watched: renewal and the safe deadline still apply
	}
	lk.mu.Lock()
	held := lk.state == stateHeld
	if held {
		lk.unwatch = stop
	}
	lk.mu.Unlock()
	if !held {
		stop()
	}
}

// stopWatch ends the HoldWatcher watch, if any. Called without lk.mu held.
func (lk *Lock) stopWatch() {
	lk.mu.Lock()
	stop := lk.unwatch
	lk.unwatch = nil
	lk.mu.Unlock()
	if stop != nil {
		stop()
	}
}

func (lk *Lock) onDeadline() {
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return
	}
	if d := time.Until(lk.deadline); d > 0 {
		lk.timer.Reset(d)
		lk.mu.Unlock()
		return
	}
	lk.mu.Unlock()
	lk.lose(fmt.Errorf("%w: no successful renewal before the safe deadline (TTL minus drift allowance)", ErrNotHeld), true)
}

// refresh sends one Refresh with ttl and moves the safe deadline. auto marks
// a background renewal, which gets its own timeout.
func (lk *Lock) refresh(ctx context.Context, ttl time.Duration, auto bool) error {
	select {
	case lk.io <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-lk.stop:
		return lk.notHeld()
	}
	defer func() { <-lk.io }()

	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return lk.notHeld()
	}
	if ttl == 0 {
		ttl = lk.ttl
	}
	deadline := lk.deadline
	lk.mu.Unlock()

	start := time.Now()
	if auto {
		var cancel context.CancelFunc
		d := start.Add(ttl / 3)
		if deadline.Before(d) {
			d = deadline
		}
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	err := lk.l.drv.Refresh(ctx, lk.key, lk.owner, ttl)
	if errors.Is(err, ErrNotHeld) {
		lk.lose(fmt.Errorf("%w: the server no longer has it (expired, taken over or deleted)", ErrNotHeld), false)
		return lk.notHeld()
	}
	next := lk.l.safeDeadline(start, ttl)
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.state != stateHeld {
		return lk.notHeldLocked()
	}
	// On success the server's expiry is at least next. On failure the
	// refresh may or may not have been applied: keep whichever deadline is
	// earlier, which is right in both cases.
	if err == nil || next.Before(lk.deadline) {
		lk.deadline = next
		lk.timer.Reset(time.Until(next))
	}
	if err == nil {
		lk.ttl = ttl
	}
	return err
}

func (lk *Lock) notHeld() error {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.notHeldLocked()
}

func (lk *Lock) notHeldLocked() error {
	switch {
	case lk.cause != nil:
		return lk.cause
	case lk.state == stateReleased:
		return fmt.Errorf("%w: released", ErrNotHeld)
	}
	return ErrNotHeld
}

// renewLoop refreshes the lock every TTL/3 until it stops being held. A
// transient error is retried every TTL/20 (at least 5ms) until the safe
// deadline passes, at which point onDeadline declares the lock lost.
func (lk *Lock) renewLoop() {
	defer close(lk.done)
	t := time.NewTimer(lk.TTL() / 3)
	defer t.Stop()
	for {
		select {
		case <-lk.stop:
			return
		case <-lk.kick:
			t.Reset(lk.TTL() / 3)
			continue
		case <-t.C:
		}
		err := lk.refresh(lk.ctx, 0, true)
		switch {
		case err == nil:
			t.Reset(lk.TTL() / 3)
		case errors.Is(err, ErrNotHeld):
			return
		default:
			t.Reset(max(lk.TTL()/20, 5*time.Millisecond))
		}
	}
}
