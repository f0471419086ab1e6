package locker

import (
	"context"
	"errors"
	"iter"
	"time"
)

// Observe returns the leaders of the election as they change: first the
// current one (a zero Leader, Term 0, if nobody leads) at once, then a
// Leader each time another is elected, and a zero Leader when the leader
// is gone and nobody has yet taken its place. The terms it yields only
// increase; a change it could not see (two leaders in quick succession)
// shows as a jump in terms. Renewals of the same leader are not changes.
//
// How soon a change is seen depends on what the driver can tell. Where
// the driver is a driver.ChangeWatcher (etcd, Redis and rueidis on one
// deployment, PostgreSQL lease mode when not behind a pooler, file, mem), it
// tells Observe of every grant and release: Observe reads the holder at
// once, so a new term is seen within a few round trips of its grant. It
// then reads again only when the leader's lock would run out (an expiry
// need not be notified), and at least every 2s as a safety net. Where the
// driver cannot watch changes, a driver.HoldWatcher reports a term that
// another process or the server ended, but never the leader's own resign,
// and a driver.Waiter (Redlock) reports releases where it wakes every
// subscriber; neither reports a grant. So there (and on PostgreSQL
// advisory mode, which has neither for an observer) Observe reads the
// holder at least every 100ms while a leader holds, whatever
// notifications it has, and once a term has ended it reads again at once
// and then at 2ms, 4ms, …, up to every 100ms until someone leads: a change
// is seen within 100ms plus one round trip.
//
// An error reading the holder is yielded with a zero Leader; the
// sequence then goes on, retrying with backoff (up to 2s), unless the
// error is permanent (ErrInvalid, ErrClosed, errors.ErrUnsupported), after
// which it ends. It ends without an error when ctx ends, or when the loop
// over it stops. It makes no call before the loop starts.
func (e *Election) Observe(ctx context.Context) iter.Seq2[Leader, error] {
	return func(yield func(Leader, error) bool) {
		if err := e.check("observe"); err != nil {
			yield(Leader{}, err)
			return
		}
		o := &observer{e: e, signal: make(chan struct{}, 1)}
		defer o.stop()
		o.watchChanges(ctx)
		o.run(ctx, yield)
	}
}

// Observe's schedule.
const (
	// observePoll is the longest Observe goes without reading the holder
	// when no notification covers the change it waits for.
	observePoll = 100 * time.Millisecond
	// observeFast is the first re-read after a term ended.
	observeFast = 2 * time.Millisecond
	// observeSafety is the longest Observe goes without reading the
	// holder while a driver.ChangeWatcher watches the election: a safety
	// net, as the timers of Acquire's waits.
	observeSafety = fallbackMax
)

// observer is one Observe loop: its notifications and what it has seen.
type observer struct {
	e      *Election
	signal chan struct{} // a possible change: the ChangeWatcher, the hold watch or the Waiter

	unchange    func()          // ends the ChangeWatcher watch; nil if none
	wake        <-chan struct{} // the Waiter's subscription, once made
	unsub       func()
	unwatch     func() // the hold watch of the current leader's grant
	watchFailed bool   // the driver refused a hold watch

	seen    bool   // something was yielded
	last    Leader // the last yielded
	lastOwn string // the owner of the last yielded leader
	maxTerm uint64
}

func (o *observer) stop() {
	if o.unchange != nil {
		o.unchange()
	}
	if o.unwatch != nil {
		o.unwatch()
	}
	if o.unsub != nil {
		o.unsub()
	}
}

// run is Observe's loop.
func (o *observer) run(ctx context.Context, yield func(Leader, error) bool) {
	fast := time.Duration(0) // the re-read delay while nobody leads after a term; 0: none pending
	errDelay := backoffMin
	for {
		ld, owner, err := o.e.leader(ctx)
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case err == nil || errors.Is(err, ErrNotHeld):
			errDelay = backoffMin
			if err != nil {
				ld, owner = Leader{}, ""
			}
			if !o.changed(ld) {
				wait = o.idle(ld, &fast)
				break
			}
			o.seen, o.last, o.lastOwn = true, ld, owner
			o.maxTerm = max(o.maxTerm, ld.Term)
			if !yield(ld, nil) {
				return
			}
			o.follow(ctx, ld, owner)
			fast = 0
			if ld.Term == 0 {
				fast = observeFast
			}
			wait = o.idle(ld, &fast)
		case errors.Is(err, ErrInvalid) || errors.Is(err, ErrClosed) || errors.Is(err, errors.ErrUnsupported):
			yield(Leader{}, err)
			return
		default:
			if !yield(Leader{}, err) {
				return
			}
			wait, errDelay = jitter(errDelay), min(2*errDelay, fallbackMax)
		}
		if !o.sleep(ctx, wait) {
			return
		}
	}
}

// changed reports whether ld is news: the first reading, a higher term, or
// the end of the last leader's term. A lower term is never news.
func (o *observer) changed(ld Leader) bool {
	switch {
	case !o.seen:
		return true
	case ld.Term == 0:
		return o.last.Term != 0
	default:
		return ld.Term > o.maxTerm
	}
}

// watchChanges starts the driver's ChangeWatcher on the election's key, if
// it has one, before the first read: from then on every grant and release
// makes Observe read at once. If the driver refuses, Observe relies on its
// reads, the hold watch and the Waiter.
func (o *observer) watchChanges(ctx context.Context) {
	cw := o.e.l.changes
	if cw == nil {
		return
	}
	if stop, err := cw.WatchChanges(ctx, o.e.key, o.notify); err == nil {
		o.unchange = stop
	}
}

// idle returns how long to wait before reading again, with ld the holder
// just read (zero: nobody). fast is the re-read delay after a term ended.
func (o *observer) idle(ld Leader, fast *time.Duration) time.Duration {
	if o.unchange != nil && (ld.Term == 0 || ld.Term >= o.maxTerm) {
		// Every grant and release is notified: read again when the
		// leader's lock would run out (an expiry need not be notified),
		// and at least every observeSafety.
		if ld.Term == 0 {
			return observeSafety
		}
		if ld.Remaining > 0 {
			return min(ld.Remaining+time.Millisecond, observeSafety)
		}
		return observePoll
	}
	if ld.Term == 0 || ld.Term < o.maxTerm {
		if *fast == 0 {
			return observePoll
		}
		d := *fast
		*fast = min(2**fast, observePoll)
		return d
	}
	// No notification is trusted to cover every change while a leader
	// holds: a hold watch need not report the owner's own resign
	// (driver.HoldWatcher), and a Waiter may wake only the waiters queued
	// for the key (the Redis fair queue), not an observer. Read at least
	// every observePoll whatever notifications there are; they only make
	// the read come sooner.
	return observePoll
}

// follow starts the notifications for the leader just yielded, unless a
// ChangeWatcher already covers every change: a hold watch on its grant
// where the driver has one; else, or once a hold watch has been refused,
// the Waiter. A driver whose hold watches work is
// followed through them only: its Waiter may queue observers together with
// candidates, as etcd's does, and an observer must not take a candidate's
// turn.
func (o *observer) follow(ctx context.Context, ld Leader, owner string) {
	if o.unchange != nil {
		return // every change is notified
	}
	if o.unwatch != nil {
		o.unwatch()
		o.unwatch = nil
	}
	w := o.e.l.watcher
	if ld.Term != 0 && w != nil {
		stop, err := w.WatchHold(o.e.key, owner, ld.Term, func(error) { o.notify() })
		if err == nil {
			o.unwatch = stop
			return
		}
		o.watchFailed = true
	}
	if o.wake != nil || o.e.l.waiter == nil || (w != nil && !o.watchFailed) {
		return
	}
	wake, cancel, err := o.e.l.waiter.Subscribe(ctx, o.e.key)
	if err == nil {
		o.wake, o.unsub = wake, cancel
	}
}

func (o *observer) notify() {
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// sleep waits d, or less if a notification comes; false once ctx is done.
func (o *observer) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-o.signal:
	case <-o.wake:
	case <-ctx.Done():
		return false
	case <-o.e.l.closing:
	}
	return ctx.Err() == nil
}
