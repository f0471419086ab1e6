package locker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
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
// owner prefix. A backend that reports back only shorter owners
// (driver.Capabilities.MaxOwner) has a lower limit (see Election.Campaign).
const MaxElectionValue = maxOwnerLen - ownerIDLen

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
	case len(value) > e.MaxValue():
		err = fmt.Errorf("%w: election value is %d bytes, the limit is %d%s", ErrInvalid, len(value), max(e.MaxValue(), 0), e.limitBy())
	case e.l.caps.OwnerASCII && !printableASCII(value):
		err = fmt.Errorf("%w: election value %q is not printable ASCII, the only bytes driver %T reports back (driver.Capabilities.OwnerASCII)",
			ErrInvalid, value, e.l.drv)
	}
	if err != nil {
		return prefix("campaign", e.name, err)
	}
	return nil
}

// MaxValue returns the longest value, in bytes, Campaign and Lead accept on
// e's Locker: MaxElectionValue, or less where the driver declares a shorter
// driver.Capabilities.MaxOwner (an election owner is the value plus 16
// bytes); negative if the driver's owners are too short for any election.
// Where the driver declares OwnerASCII, values must also be printable
// ASCII.
func (e *Election) MaxValue() int {
	if m := e.l.caps.MaxOwner; m > 0 && m-ownerIDLen < MaxElectionValue {
		return m - ownerIDLen
	}
	return MaxElectionValue
}

// limitBy says where a limit below MaxElectionValue comes from.
func (e *Election) limitBy() string {
	if e.MaxValue() == MaxElectionValue {
		return ""
	}
	return fmt.Sprintf(" (driver %T reports back owners of at most %d bytes, driver.Capabilities.MaxOwner, and an election owner has %d more)",
		e.l.drv, e.l.caps.MaxOwner, ownerIDLen)
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
// value longer than MaxElectionValue, or than the driver's
// driver.Capabilities.MaxOwner less 16 bytes, or not printable ASCII where
// the driver declares OwnerASCII (PostgreSQL advisory mode: 18 printable
// ASCII bytes), each error naming the limit; an error matching
// errors.ErrUnsupported, naming the
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
	// A grant whose reply came back after its safe deadline (a reply
	// delayed past the TTL) may already have been followed by another
	// candidate's: fn must not run for it, even for as long as the Lock
	// takes to declare the loss. Resign, and campaign again.
	late := !time.Now().Before(lk.Deadline())
	defer func() {
		// The Lock cancels fctx with its loss before Lost closes.
		lost = late || errors.Is(context.Cause(fctx), ErrNotHeld)
		cancel(nil)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		if rerr := lk.Release(rctx); rerr != nil && !lost && !errors.Is(rerr, ErrNotHeld) {
			err = errors.Join(err, rerr)
		}
	}()
	if late {
		return true, nil
	}
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
