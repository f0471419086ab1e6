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
// gone (expired, taken over, deleted), the safe local deadline passes
// without a successful renewal, or WithMaxHold's bound passes. Lost tells
// you the moment that happens, and Err why.
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
	start     time.Time // when the granting call was sent: locker.hold.duration counts from it
	granted   time.Time // when the grant was known (see Granted): WithMaxHold and WithMinHold count from it
	minUntil  time.Time // WithMinHold: the key stays taken until then; zero without
	attrs     *attrSets // nil without telemetry
	hold      holdOps   // Refresh and Release on the server: the driver's, or a shared hold's (shared.go)
	batched   bool      // renewals go through the Locker's batcher (renew.go)

	io chan struct{}    // serialises refreshes, so the last success is the last applied; made by the first (ioSlot)
	ev [numEvents]event // the deadline, max-hold and renewal events (sched.go)

	// renewals counts the automatic renewal in flight (0 or 1): Release
	// waits for it. Added to only under mu while the lock is held.
	renewals sync.WaitGroup

	mu           sync.Mutex
	ttl          time.Duration
	deadline     time.Time
	maxHold      bool               // WithMaxHold: ev[evMaxHold] is scheduled
	renewing     bool               // an automatic renewal is in flight
	renewCancel  context.CancelFunc // cuts short the renewal in flight; nil if none
	stop         chan struct{}      // closed when the lock stops being held; made on demand
	state        lockState
	lostErr      *lostError    // why Lost was closed; set just before it closes
	lost         chan struct{} // made on demand (Lost); closedChan if it closed before
	releaseRetry bool
	releaseBusy  bool          // a release is under way
	releasing    chan struct{} // closed when the release under way ends; made by the first who waits for it
	unwatch      func()        // ends the driver.HoldWatcher watch; nil if none
	onLost       func(error)   // options.onLost
}

func newLock(l *Locker, key string, o options, token uint64, start, granted time.Time) *Lock {
	lk := &Lock{
		l: l, key: key, owner: o.owner, token: token, autoRenew: o.autoRenew,
		start: start, granted: granted, attrs: o.attrs, onLost: o.onLost,
		ttl:      o.ttl,
		deadline: l.safeDeadline(start, o.ttl),
		hold:     o.hold,
	}
	for k := range lk.ev {
		lk.ev[k] = event{lk: lk, kind: eventKind(k), i: -1}
	}
	if lk.hold == nil {
		lk.hold = l.drv
		lk.batched = l.batch != nil
	}
	if o.minHold > 0 {
		// Counted from when the grant was known, after the server made
		// it, so the key is taken for at least minHold after the grant.
		lk.minUntil = granted.Add(o.minHold)
	}
	lk.mu.Lock()
	if t := l.tel; t != nil {
		t.holdStart(lk.attrs)
	}
	s := l.sched
	s.schedule(&lk.ev[evDeadline], lk.deadline)
	if o.maxHold > 0 {
		lk.maxHold = true
		s.schedule(&lk.ev[evMaxHold], granted.Add(o.maxHold))
	}
	if lk.autoRenew {
		s.schedule(&lk.ev[evRenew], time.Now().Add(o.ttl/3))
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

// Granted returns when the grant was known: the moment the call that won
// the lock returned, on the local monotonic clock. The server made the
// grant at that moment or before (at some point of the call, or of a wait
// in the server), so it is the latest the grant can have been: WithMaxHold
// and WithMinHold count from it, which makes neither bound shorter than
// from the grant. The safe deadline counts from the start of the call
// instead (see Deadline), the earliest the server can have started the
// TTL.
func (lk *Lock) Granted() time.Time { return lk.granted }

// Lost returns a channel that is closed when the lock is lost or presumed
// lost: a renewal, Refresh or Release was told the lock is gone, the safe
// deadline passed without a successful renewal, the Locker was closed,
// WithMaxHold's bound passed, or the driver saw the server end the lock
// early (driver.HoldWatcher). Err then says which (see LostCause). It
// closes before the server can grant the key to anyone else when the lock
// ends by its TTL, given the drift allowance (clocks that differ in rate by
// under 1%, or the driver's wider margin). It is not closed by a successful
// Release.
func (lk *Lock) Lost() <-chan struct{} { return lk.onDemand(&lk.lost) }

// onDemand returns *ch, made first if it is nil (Lost and stopped make
// their channels only when asked for them).
func (lk *Lock) onDemand(ch *chan struct{}) chan struct{} {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if *ch == nil {
		*ch = make(chan struct{})
	}
	return *ch
}

// closedChan is a closed channel: Lost's, when it closed before anyone
// asked for it, and stopped's, once the lock has ended.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Err returns nil until Lost is closed, and from then on why it was: an
// error that matches ErrNotHeld and exactly one LostCause with errors.Is
// (errors.As reads the LostCause), and the driver's report where there was
// one; it never matches ErrNotAcquired. Do's context has the same error as
// its context.Cause, and Refresh and Release return it from then on. After
// a successful Release Err stays nil. Tested by TestLostCauses.
func (lk *Lock) Err() error {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.lostErr == nil {
		return nil
	}
	return lk.lostErr
}

// Refresh resets the lock's TTL on the server to ttl, which also becomes the
// TTL automatic renewal uses from then on. ttl is rounded as in WithTTL.
// It returns ErrNotHeld once the lock is released or lost (and then Lost is
// closed), ErrInvalid for a non-positive ttl, or the driver's error, after
// which the lock is still held until its safe deadline passes. After
// Close, or when Close cuts it short, it returns an error matching
// ErrClosed.
func (lk *Lock) Refresh(ctx context.Context, ttl time.Duration) error {
	if ttl <= 0 {
		return wrap(ctx, "refresh", lk.key, fmt.Errorf("%w: ttl must be positive, got %v", ErrInvalid, ttl))
	}
	cctx, done, err := lk.l.begin(ctx, lk.l.life)
	if err != nil {
		return wrap(ctx, "refresh", lk.key, lk.closedErr())
	}
	err = done(lk.refresh(cctx, lk.l.caps.RoundTTL(ttl), false))
	if err == nil {
		lk.renewAfter(lk.TTL() / 3)
	}
	return wrap(ctx, "refresh", lk.key, err)
}

// Release frees the lock on the server and stops its renewal; under
// WithMinHold, before its bound, it sets the lock to expire at the bound
// instead. It returns ErrNotHeld if the lock was no longer held (it had been
// released, lost, or taken over), after which Lost is closed. On any other
// error renewal has stopped anyway and the lock expires after its TTL;
// Release may be called again to retry. A Release called while another is
// under way waits for it. After Close, or when Close cuts it short, it
// returns an error matching ErrClosed (Close releases the lock itself).
func (lk *Lock) Release(ctx context.Context) error {
	t := lk.l.tel
	if t == nil {
		return wrap(ctx, "release", lk.key, lk.releaseTracked(ctx))
	}
	ctx, span := t.startRelease(ctx, lk)
	err := wrap(ctx, "release", lk.key, lk.releaseTracked(ctx))
	endRelease(span, err)
	return err
}

// releaseTracked is release as a call in flight, which Close waits for and
// cuts short only once it has released its own locks.
func (lk *Lock) releaseTracked(ctx context.Context) error {
	cctx, done, err := lk.l.begin(ctx, lk.l.grace)
	if err != nil {
		return lk.closedErr()
	}
	return done(lk.release(cctx, nil))
}

// closedErr is what Release and Refresh return once the Locker is closed:
// ErrClosed, with why the lock ended if it had.
func (lk *Lock) closedErr() error {
	lk.mu.Lock()
	held := lk.state == stateHeld
	lk.mu.Unlock()
	if held {
		return ErrClosed // Close releases it
	}
	e := lk.notHeld()
	if errors.Is(e, ErrClosed) {
		return e // released by Close
	}
	return fmt.Errorf("%w (%w)", ErrClosed, e)
}

// release ends the lock. closing is the loss to report once the server
// side is done, when the Locker is being closed; nil for Release. A
// release already under way is waited for first.
func (lk *Lock) release(ctx context.Context, closing *lostError) error {
	lk.mu.Lock()
	for lk.releaseBusy {
		if lk.releasing == nil {
			lk.releasing = make(chan struct{})
		}
		ch := lk.releasing
		lk.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			if closing != nil {
				lk.closeLost(closing, false)
			}
			return ctx.Err()
		}
		lk.mu.Lock()
	}
	ended := false
	switch lk.state {
	case stateLost:
		e := lk.lostErr
		lk.mu.Unlock()
		return e
	case stateReleased:
		if !lk.releaseRetry {
			err := lk.notHeldLocked()
			lk.mu.Unlock()
			return err
		}
	case stateHeld:
		lk.state = stateReleased
		lk.endLocked()
		ended = true
	}
	lk.releaseRetry = false
	lk.releaseBusy = true
	lk.mu.Unlock()
	defer lk.releaseEnded()
	if ended {
		lk.holdEnded()
	}
	lk.stopWatch()
	lk.renewals.Wait()

	err := lk.free(ctx)
	lk.l.untrack(lk)
	switch {
	case err == nil:
		lk.l.notifyLocal(lk.key)
		if closing != nil {
			lk.closeLost(closing, false)
		}
	case errors.Is(err, ErrNotHeld):
		e := serverLost("Release was told the server no longer has it", err)
		lk.closeLost(e, true)
		return lk.Err()
	default:
		lk.mu.Lock()
		lk.releaseRetry = true
		lk.mu.Unlock()
		if closing != nil {
			lk.closeLost(closing, false)
		}
	}
	return err
}

// releaseEnded ends the release under way, and wakes those who wait for
// it.
func (lk *Lock) releaseEnded() {
	lk.mu.Lock()
	lk.releaseBusy = false
	ch := lk.releasing
	lk.releasing = nil
	lk.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// free ends the lock on the server with an owner-checked release, or, while
// WithMinHold's bound is ahead, with an owner-checked refresh to the time
// left, after which the lock expires on its own.
func (lk *Lock) free(ctx context.Context) error {
	if !lk.minUntil.IsZero() {
		if left := time.Until(lk.minUntil); left > 0 {
			// At least 1ms: every backend keeps whole milliseconds.
			ttl := lk.l.caps.RoundTTL(max(left, time.Millisecond))
			ctx, end := lk.l.tel.child(ctx, "locker.driver.refresh")
			err := lk.hold.Refresh(ctx, lk.key, lk.owner, ttl)
			end(err)
			return err
		}
	}
	ctx, end := lk.l.tel.child(ctx, "locker.driver.release")
	err := lk.hold.Release(ctx, lk.key, lk.owner)
	end(err)
	return err
}

// endLocked stops renewal and the timers. lk.mu is held.
func (lk *Lock) endLocked() {
	if lk.stop != nil {
		close(lk.stop)
	}
	lk.stop = closedChan
	if lk.renewCancel != nil {
		lk.renewCancel()
	}
	lk.l.sched.cancel(lk.ev[:])
}

// stopped returns a channel closed once the lock stops being held.
func (lk *Lock) stopped() <-chan struct{} { return lk.onDemand(&lk.stop) }

// holdEnded records the end of the hold, once the lock has left stateHeld.
func (lk *Lock) holdEnded() {
	if t := lk.l.tel; t != nil {
		t.holdEnd(lk.attrs, lk.start)
	}
}

// closeLost records e as the reason and closes Lost, unless it is closed
// already. With markLost the lock's state becomes stateLost too, in the
// same step, so that Release never sees a lost lock without its reason.
func (lk *Lock) closeLost(e *lostError, markLost bool) {
	lk.mu.Lock()
	if markLost {
		lk.state = stateLost
	}
	first := lk.lostErr == nil
	if first {
		lk.lostErr = e
	}
	lk.mu.Unlock()
	if first {
		lk.announce(e)
	}
}

// announce closes Lost, which lk.lostErr (now e) explains, and reports it.
// Metrics are recorded first, so that they count the loss once Lost is
// closed; the log record follows.
func (lk *Lock) announce(e *lostError) {
	if lk.onLost != nil {
		lk.onLost(e)
	}
	t := lk.l.tel
	if t != nil {
		t.lostCount(lk, e)
	}
	lk.mu.Lock()
	ch := lk.lost
	if ch == nil {
		lk.lost = closedChan // closed before anyone asked for it
	}
	lk.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if t != nil {
		t.lostLog(lk, e)
	}
}

// lose marks a held lock lost and closes Lost, and reports whether it did
// (false if the lock had already ended). If the loss is only presumed (the
// deadline passed) or was decided here (WithMaxHold), the lock is then
// freed on the server in the background (see free), owner-checked, in case
// the server still has it.
func (lk *Lock) lose(e *lostError, releaseOnServer bool) bool {
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return false
	}
	lk.state = stateLost
	lk.endLocked()
	first := lk.lostErr == nil
	if first {
		lk.lostErr = e
	}
	// Registered with the state change, so that a Close that finds the
	// lock lost waits for this clean-up before it closes the driver.
	cleanup := releaseOnServer && lk.l.enter(true)
	lk.mu.Unlock()
	lk.holdEnded()
	if first {
		lk.announce(e)
	}
	lk.stopWatch()
	lk.l.untrack(lk)
	lk.l.notifyLocal(lk.key)
	if cleanup {
		lk.l.cleanupEntered(func(ctx context.Context) { _ = lk.free(ctx) })
	}
	return true
}

// watch starts the driver's HoldWatcher on this grant, if it has one, so
// that a lock the server ends early (a session that dies, a key deleted or
// overwritten) closes Lost at once. Called without lk.mu or Locker.mu held.
func (lk *Lock) watch(w driver.HoldWatcher) {
	if _, shared := lk.hold.(*sharedOps); w == nil || shared {
		return
	}
	stop, err := w.WatchHold(lk.key, lk.owner, lk.token, func(err error) {
		lk.lose(&lostError{cause: CauseServer, msg: "the backend reports it gone", err: err}, false)
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

// expire is a due deadline or max-hold event (run on a goroutine of its
// own by the scheduler): the lock is lost, and freed on the server. A
// deadline that a renewal moved meanwhile is scheduled again.
func (lk *Lock) expire(k eventKind) {
	e := errMaxHold
	if k == evDeadline {
		lk.mu.Lock()
		held, due := lk.state == stateHeld, !time.Now().Before(lk.deadline)
		if held && !due {
			lk.l.sched.schedule(&lk.ev[evDeadline], lk.deadline)
		}
		lk.mu.Unlock()
		if !held || !due {
			return
		}
		e = errDeadline
	}
	e = &lostError{cause: e.cause, msg: e.msg}
	lk.lose(e, true)
}

// The losses expire declares (copied for each lock).
var (
	errDeadline = &lostError{cause: CauseDeadline, msg: "no successful renewal before the safe deadline (TTL minus drift allowance)"}
	errMaxHold  = &lostError{cause: CauseMaxHold, msg: "held for the bound set by WithMaxHold: renewal stopped and the lock is released"}
)

// ioSlot returns io, made on the first call: a lock released before its
// first refresh needs none.
func (lk *Lock) ioSlot() chan struct{} {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	if lk.io == nil {
		lk.io = make(chan struct{}, 1)
	}
	return lk.io
}

// refresh sends one Refresh with ttl and moves the safe deadline. auto marks
// a background renewal (renewOnce, which bounds ctx), which on a driver
// that is a driver.BatchRefresher goes to the server in a batch (renew.go).
func (lk *Lock) refresh(ctx context.Context, ttl time.Duration, auto bool) error {
	io := lk.ioSlot()
	select {
	case io <- struct{}{}:
	default:
		select {
		case io <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		case <-lk.stopped():
			return lk.notHeld()
		}
	}
	defer func() { <-io }()

	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return lk.notHeld()
	}
	if ttl == 0 {
		ttl = lk.ttl
	}
	lk.mu.Unlock()

	start, err := lk.send(ctx, ttl, auto, time.Now())
	t := lk.l.tel
	if errors.Is(err, ErrNotHeld) {
		who := "a renewal"
		if !auto {
			who = "Refresh"
		}
		e := serverLost(who+" was told the server no longer has it", err)
		if lk.lose(e, false) && t != nil {
			t.renewal(lk, renewalLost, err, auto)
		}
		return lk.notHeld()
	}
	next := lk.l.safeDeadline(start, ttl)
	lk.mu.Lock()
	if lk.state != stateHeld {
		lk.mu.Unlock()
		return lk.notHeld()
	}
	// On success the server's expiry is at least next. On failure the
	// refresh may or may not have been applied: keep whichever deadline is
	// earlier, which is right in both cases.
	if err == nil || next.Before(lk.deadline) {
		lk.deadline = next
		lk.l.sched.schedule(&lk.ev[evDeadline], next)
	}
	if err == nil {
		lk.ttl = ttl
	}
	lk.mu.Unlock()
	if t != nil {
		if err == nil {
			t.renewal(lk, renewalOK, nil, auto)
		} else {
			t.renewal(lk, renewalError, err, auto)
		}
	}
	return err
}

// send makes the refresh's call: a batch for an automatic renewal where the
// Locker batches them, a Refresh otherwise. It returns when the call was
// sent: start, or, for a batch, when the batch was (later than start).
func (lk *Lock) send(ctx context.Context, ttl time.Duration, auto bool, start time.Time) (time.Time, error) {
	ctx, end := lk.l.tel.child(ctx, "locker.driver.refresh")
	var err error
	if auto && lk.batched {
		var sent time.Time
		if sent, err = lk.l.batch.refresh(ctx, lk.key, lk.owner, ttl); !sent.IsZero() {
			start = sent
		}
	} else {
		err = lk.hold.Refresh(ctx, lk.key, lk.owner, ttl)
	}
	end(err)
	return start, err
}

func (lk *Lock) notHeld() error {
	lk.mu.Lock()
	defer lk.mu.Unlock()
	return lk.notHeldLocked()
}

func (lk *Lock) notHeldLocked() error {
	switch {
	case lk.lostErr != nil:
		return lk.lostErr
	case lk.state == stateReleased:
		return fmt.Errorf("%w: already released", ErrNotHeld)
	}
	return ErrNotHeld
}

// renewAfter schedules the next automatic renewal d from now, if the lock
// renews itself and is still held.
func (lk *Lock) renewAfter(d time.Duration) {
	if !lk.autoRenew {
		return
	}
	lk.mu.Lock()
	if lk.state == stateHeld && !lk.renewing {
		lk.l.sched.schedule(&lk.ev[evRenew], time.Now().Add(d))
	}
	lk.mu.Unlock()
}

// renewOnce is one automatic renewal, when it falls due; it schedules the
// next: TTL/3 after a success; after a transient error, a retry every
// TTL/20 (at least 5ms) until the safe deadline passes, at which point
// onDeadline declares the lock lost. A renewal of a lock that has ended,
// or while another is in flight, is not made. A renewal gets TTL/3, and no
// more than until the safe deadline; Release and Close cut it short
// (renewCancel). One context serves both, as a renewal is made thousands
// of times a second with many locks held.
func (lk *Lock) renewOnce() {
	lk.mu.Lock()
	if lk.state != stateHeld || lk.renewing {
		lk.mu.Unlock()
		return
	}
	d := time.Now().Add(lk.ttl / 3)
	if lk.deadline.Before(d) {
		d = lk.deadline
	}
	ctx, cancel := context.WithDeadline(context.Background(), d)
	lk.renewing, lk.renewCancel = true, cancel
	lk.renewals.Add(1)
	lk.mu.Unlock()
	defer lk.renewals.Done()

	err := lk.refresh(ctx, 0, true)
	cancel()
	lk.mu.Lock()
	lk.renewing, lk.renewCancel = false, nil
	lk.mu.Unlock()
	switch {
	case err == nil:
		lk.renewAfter(lk.TTL() / 3)
	case errors.Is(err, ErrNotHeld):
	case time.Now().Before(lk.Deadline()):
		lk.renewAfter(max(lk.TTL()/20, 5*time.Millisecond))
	}
}
