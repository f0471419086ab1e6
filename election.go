package locker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"iter"
	"time"
)

// ElectionPrefix is the key namespace of elections: the election named name
// is the lock on the key ElectionPrefix + name. An election therefore never
// shares its lock with a mutex of the same name, but a mutex whose key
// begins with ElectionPrefix is the lock of an election (and is counted as
// one, with locker.kind=election); keep such keys for elections.
const ElectionPrefix = "locker/election/"

// Election is a leader election on one name: a lock whose holder is the
// leader, whose fencing token is the leader's term, and whose owner carries
// the value the leader campaigned with, so that everyone can see who leads.
// It is built on the Locker's lock (Acquire, renewal, Lost, tokens) and the
// driver's driver.Inspector, so it works on every backend with an
// Inspector. Its methods are safe for concurrent use.
//
// The guarantees are the lock's: at most one leader at a time; each term is
// strictly greater than every earlier term of the election (across restarts
// of the server where driver.Capabilities.DurableTokens holds); and a
// leader learns of its loss (Lead cancels fn's context, the Lock's Lost
// closes) before any other candidate can be elected, wherever the backend
// keeps a lock for its TTL. Pass the term to the resources the leader
// writes to, and have them reject a term lower than one they have seen.
type Election struct {
	l    *Locker
	name string
	key  string
}

// Leader describes the current leader of an election.
type Leader struct {
	// Value is the value the leader campaigned with; it is fixed for the
	// term.
	Value string
	// Term is the leader's term: the fencing token of its grant. Zero in
	// the Leader that Observe yields when nobody leads.
	Term uint64
	// Remaining is the time the leader's lock had left on the server when
	// it was read (it is renewed every TTL/3 while the leader lives). Zero
	// where the backend cannot tell.
	Remaining time.Duration
}

// Election returns the election called name on l. Nothing is checked or
// sent until a method is called: an empty name, or one longer than the key
// limit less len(ElectionPrefix), makes every method fail with ErrInvalid
// before any I/O. The election's lock is the key ElectionPrefix + name.
func (l *Locker) Election(name string) *Election {
	return &Election{l: l, name: name, key: ElectionPrefix + name}
}

// Name returns the election's name.
func (e *Election) Name() string { return e.name }

// ownerIDLen is the length of the prefix of every owner of an election
// lock: "~" and 88 random bits in base64url (15 bytes). The value follows
// it, so an owner is decoded by length alone, never by splitting on a
// separator; the "~" tells it from the owners package locker makes for
// other locks (hexadecimal).
const ownerIDLen = 16

// MaxElectionValue is the longest value a candidate can campaign with on
// most backends: the owner limit (256 bytes) less the election's 16-byte
// owner prefix. A backend that publishes only part of a holder's owner has
// a lower limit (see Election.Campaign).
const MaxElectionValue = maxOwnerLen - ownerIDLen

// maxTaggedValue is the limit on a backend whose locks belong to their
// connection (driver.Capabilities.LockerBound: PostgreSQL advisory mode),
// which publishes only the first 34 printable ASCII bytes of an owner.
const maxTaggedValue = 34 - ownerIDLen

func electionOwner(value string) string {
	var b [11]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand doc)
	return "~" + base64.RawURLEncoding.EncodeToString(b[:]) + value
}

// decodeOwner returns the value in an election owner, or false if owner is
// not one (a lock taken outside the election, a Redis queue reservation, a
// PostgreSQL holder whose owner was too long to publish).
func decodeOwner(owner string) (string, bool) {
	if len(owner) < ownerIDLen || owner[0] != '~' {
		return "", false
	}
	for i := 1; i < ownerIDLen; i++ {
		c := owner[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return "", false
		}
	}
	return owner[ownerIDLen:], true
}

// check validates the election before any I/O: its name, and that the
// driver can inspect. op names the call in the error.
func (e *Election) check(op string) error {
	var err error
	switch {
	case e.name == "":
		err = fmt.Errorf("%w: empty election name", ErrInvalid)
	case len(e.key) > maxKeyLen:
		err = fmt.Errorf("%w: election name is %d bytes, the limit is %d", ErrInvalid, len(e.name), maxKeyLen-len(ElectionPrefix))
	case e.l.inspector == nil:
		err = fmt.Errorf("driver %T cannot inspect (driver.Inspector), which elections need: %w", e.l.drv, errors.ErrUnsupported)
	}
	if err != nil {
		return prefix(op, e.name, err)
	}
	return nil
}

// checkValue validates a candidate's value and options before any I/O.
func (e *Election) checkValue(value string, opts []Option) error {
	o, err := buildOptions(opts)
	switch {
	case err != nil:
	case o.ownerSet:
		err = fmt.Errorf("%w: WithOwner does not apply to an election: the value identifies the leader", ErrInvalid)
	case len(value) > MaxElectionValue:
		err = fmt.Errorf("%w: election value is %d bytes, the limit is %d", ErrInvalid, len(value), MaxElectionValue)
	case e.l.caps.LockerBound && (len(value) > maxTaggedValue || !printableASCII(value)):
		err = fmt.Errorf("%w: election value %q: driver %T publishes only %d printable ASCII bytes of a value (PostgreSQL advisory mode; mode=lease stores any value)",
			ErrInvalid, value, e.l.drv, maxTaggedValue)
	}
	if err != nil {
		return prefix("campaign", e.name, err)
	}
	return nil
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Campaign waits until this candidate is elected, as Acquire waits for a
// lock, and returns the leader's Lock: its Token is the term, its Lost
// closes when the lead is lost (before any other candidate can be
// elected), and Release resigns, so that the next candidate is elected
// within the backend's usual handoff. ctx bounds the wait only. value is
// what observers see as Leader.Value; it may be empty.
//
// opts are the lock's options (WithTTL, WithAutoRenew, WithMaxHold,
// WithMinHold); WithOwner is refused, since the owner carries the value. A
// Campaign that fails or is cancelled leaves nothing held: a grant whose
// reply was lost is released in the background (Close waits for it).
//
// Errors: ErrInvalid before any I/O for an empty name, a bad option, or a
// value longer than MaxElectionValue (on a driver whose locks belong to
// their connection, PostgreSQL advisory mode, longer than 18 bytes or not
// printable ASCII); an error matching errors.ErrUnsupported, naming the
// driver, if it is not a driver.Inspector; then those of Locker.Acquire.
func (e *Election) Campaign(ctx context.Context, value string, opts ...Option) (*Lock, error) {
	if err := e.check("campaign"); err != nil {
		return nil, err
	}
	if err := e.checkValue(value, opts); err != nil {
		return nil, err
	}
	return e.campaign(ctx, value, opts)
}

func (e *Election) campaign(ctx context.Context, value string, opts []Option) (*Lock, error) {
	owner := electionOwner(value)
	lk, err := e.l.Acquire(ctx, e.key, append(opts[:len(opts):len(opts)], WithOwner(owner))...)
	if err != nil {
		if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrClosed) {
			// The owner is this campaign's alone: an owner-checked
			// release of a grant whose reply was lost is always safe.
			e.l.cleanupKey(e.key, owner)
		}
		return nil, err
	}
	if t := e.l.tel; t != nil {
		t.term(lk.attrs)
	}
	return lk, nil
}

// Lead campaigns with value, runs fn while this process leads, and then
// campaigns again, until ctx ends or fn returns an error that was not
// caused by losing the lead.
//
// fn gets the term and a context that is cancelled when the lead is lost,
// before any other candidate can be elected, with the Lock's Err (matching
// ErrNotHeld and the LostCause) as its context.Cause; and when ctx ends.
// When fn returns, Lead resigns (an owner-checked release with a 5s
// timeout that ctx's end does not cut short), so the next candidate is
// elected at once; it resigns only after fn has returned. If fn returns nil
// or the lead was lost, Lead campaigns again. A transient error while
// campaigning (an unreachable backend) is retried with backoff (up to 2s).
//
// Lead returns an error wrapping ctx.Err() once ctx ends (fn's error, if
// any, is joined), fn's error if it ended the lead (joined with a failed
// resign's error), or the error of a campaign that cannot succeed:
// ErrInvalid and errors.ErrUnsupported as for Campaign, before any I/O, or
// ErrClosed. It panics if fn is nil.
func (e *Election) Lead(ctx context.Context, value string, fn func(ctx context.Context, term uint64) error, opts ...Option) error {
	if fn == nil {
		panic("locker: Election.Lead with a nil fn")
	}
	if err := e.check("lead"); err != nil {
		return err
	}
	if err := e.checkValue(value, opts); err != nil {
		return err
	}
	backoff := backoffMin
	for {
		// fn's context is cancelled from inside the Lock, as Lost closes
		// and before a presumed-lost lock is released on the server, so
		// that no other candidate can be elected first.
		fctx, cancel := context.WithCancelCause(ctx)
		lk, err := e.campaign(ctx, value, append(opts[:len(opts):len(opts)], withOnLost(cancel)))
		if err != nil {
			cancel(nil)
			if ctx.Err() != nil || errors.Is(err, ErrInvalid) || errors.Is(err, ErrClosed) || errors.Is(err, errors.ErrUnsupported) {
				return err
			}
			if !sleepCtx(ctx, jitter(backoff)) {
				return prefix("lead", e.name, fmt.Errorf("%w (last campaign error: %w)", ctx.Err(), err))
			}
			backoff = min(2*backoff, fallbackMax)
			continue
		}
		backoff = backoffMin
		lost, ferr := e.serve(ctx, fctx, cancel, lk, fn)
		switch {
		case ctx.Err() != nil:
			return prefix("lead", e.name, errors.Join(ctx.Err(), ferr))
		case lost || ferr == nil:
			continue
		default:
			return ferr
		}
	}
}

func withOnLost(f func(error)) Option { return func(o *options) { o.onLost = f } }

// serve runs fn for one term, with fctx (cancelled by the Lock when the
// lead is lost), and resigns when fn returns. lost reports that the lead
// was lost before fn returned; err is fn's error, joined with a failed
// resign's.
func (e *Election) serve(ctx, fctx context.Context, cancel context.CancelCauseFunc, lk *Lock, fn func(context.Context, uint64) error) (lost bool, err error) {
	defer func() {
		// The Lock cancels fctx with its loss before Lost closes.
		lost = errors.Is(context.Cause(fctx), ErrNotHeld)
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		if rerr := lk.Release(rctx); rerr != nil && !lost && !errors.Is(rerr, ErrNotHeld) {
			err = errors.Join(err, rerr)
		}
	}()
	return false, fn(fctx, lk.Token())
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Leader returns the current leader: its value, term, and the time its
// lock has left. Errors: an error matching ErrNotHeld when nobody leads
// (also while a lock not taken by a candidate of this election holds its
// key); ErrInvalid for an empty name and an error matching
// errors.ErrUnsupported if the driver cannot inspect, both before any I/O;
// ErrClosed; ctx.Err() wrapped; or the driver's error.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := e.check("leader"); err != nil {
		return Leader{}, err
	}
	ld, _, err := e.leader(ctx)
	return ld, err
}

// leader reads the holder of the election's key, and its owner.
func (e *Election) leader(ctx context.Context) (Leader, string, error) {
	cctx, done, err := e.l.begin(ctx, e.l.life)
	if err != nil {
		return Leader{}, "", wrap(ctx, "leader", e.name, err)
	}
	in, err := e.l.inspector.Inspect(cctx, e.key)
	if err = done(err); err != nil {
		if errors.Is(err, ErrNotHeld) {
			err = fmt.Errorf("no leader: %w", err)
		}
		return Leader{}, "", wrap(ctx, "leader", e.name, err)
	}
	value, ok := decodeOwner(in.Owner)
	if !ok || in.Token == 0 {
		return Leader{}, "", prefix("leader", e.name, fmt.Errorf("no leader: %w: the election's key is held, but not by one of its candidates", ErrNotHeld))
	}
	return Leader{Value: value, Term: in.Token, Remaining: max(in.Remaining, 0)}, in.Owner, nil
}

// Observe returns the leaders of the election as they change: first the
// current one (a zero Leader, Term 0, if nobody leads) at once, then a
// Leader each time another is elected, and a zero Leader when the leader
// is gone and nobody has yet taken its place. The terms it yields only
// increase; a change it could not see (two leaders in quick succession)
// shows as a jump in terms. Renewals of the same leader are not changes.
//
// How soon a change is seen depends on what the driver can tell. Where
// the driver is a driver.HoldWatcher (etcd, Redis on one deployment,
// file), Observe watches the leader's grant: the watch reports a term that
// another process or the server ended (the key taken over or deleted, a
// session ended) when the driver sees it, but never the leader's own
// resign, and not on every backend a lease that ran out; so while a leader
// holds, Observe also reads the holder every 100ms. Otherwise a
// driver.Waiter (mem, PostgreSQL lease mode, Redlock) reports releases,
// and Observe reads the holder when the lock would expire, and at least
// every 2s; with neither, every 100ms. Once a term has ended, Observe
// reads the holder again at once and then at 2ms, 4ms, …, up to every
// 100ms until someone leads. So a change is seen within 100ms plus one
// round trip on every backend, and within a few round trips where the
// driver reports it.
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
)

// observer is one Observe loop: its notifications and what it has seen.
type observer struct {
	e      *Election
	signal chan struct{} // a possible change: the hold watch or the Waiter

	wake        <-chan struct{} // the Waiter's subscription, once made
	unsub       func()
	unwatch     func() // the hold watch of the current leader's grant
	watchedOK   bool   // the hold watch of the current leader is running
	watchFailed bool   // the driver refused a hold watch

	seen    bool   // something was yielded
	last    Leader // the last yielded
	lastOwn string // the owner of the last yielded leader
	maxTerm uint64
}

func (o *observer) stop() {
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

// idle returns how long to wait before reading again, with ld the holder
// just read (zero: nobody). fast is the re-read delay after a term ended.
func (o *observer) idle(ld Leader, fast *time.Duration) time.Duration {
	if ld.Term == 0 || ld.Term < o.maxTerm {
		if *fast == 0 {
			return observePoll
		}
		d := *fast
		*fast = min(2**fast, observePoll)
		return d
	}
	if o.wake == nil || o.watchedOK {
		// Nothing covers a release: a hold watch need not report the
		// owner's own (driver.HoldWatcher), and there may be no Waiter.
		return observePoll
	}
	d := fallbackMax
	if ld.Remaining > 0 && ld.Remaining+expirySlack < d {
		d = ld.Remaining + expirySlack
	}
	return d
}

// follow starts the notifications for the leader just yielded: a hold
// watch on its grant where the driver has one; else, or once a hold watch
// has been refused, the Waiter. A driver whose hold watches work is
// followed through them only: its Waiter may queue observers together with
// candidates, as etcd's does, and an observer must not take a candidate's
// turn.
func (o *observer) follow(ctx context.Context, ld Leader, owner string) {
	if o.unwatch != nil {
		o.unwatch()
		o.unwatch, o.watchedOK = nil, false
	}
	w := o.e.l.watcher
	if ld.Term != 0 && w != nil {
		stop, err := w.WatchHold(o.e.key, owner, ld.Term, func(error) { o.notify() })
		if err == nil {
			o.unwatch, o.watchedOK = stop, true
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
