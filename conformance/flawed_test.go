package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// flawCaps are the capabilities of the flawed driver. Its MinTTL is wide
// enough (60ms) that a driver honouring only 1ms of it is caught by a probe
// a loaded machine schedules late. It declares a drift
// and uses half of it (its locks end a little before their TTL), so that a
// suite that ignored the declared margin would fail the correct driver.
var flawCaps = driver.Capabilities{MinTTL: 60 * time.Millisecond, DriftFactor: 0.05, DriftFixed: time.Millisecond, DurableTokens: true}

// flawStore is the "server" shared by every flawed Locker of one run.
// Expired records stay in the map (so that a flaw can misuse them) and are
// treated as absent.
type flawStore struct {
	flaw    string
	mu      sync.Mutex
	locks   map[string]*flawRec
	counter uint64
	perKey  map[string]uint64
	subs    map[string]map[*flawSub]struct{}
	watches map[string]map[*flawWatch]struct{}
	change  chan struct{}                   // closed and replaced on every release or expiry
	release chan struct{}                   // the same, on releases only
	down    time.Time                       // a restart: calls fail with ErrUnavailable until then
	quiet   bool                            // changed does not tell watchers (frees-on-cut)
	ghosts  map[string]*flawRec             // inspect-ghost-after-empty-restart
	cws     map[string]map[*flawCW]struct{} // WatchChanges (flawed_changewatch_test.go)
}

type flawRec struct {
	owner   string
	token   uint64
	ttl     time.Duration // as last set
	expires time.Time
	by      *flawed // the Locker that made the grant
	timer   *time.Timer
}

func newFlawStore(flaw string) *flawStore {
	return &flawStore{
		flaw: flaw, locks: map[string]*flawRec{}, perKey: map[string]uint64{},
		subs: map[string]map[*flawSub]struct{}{}, watches: map[string]map[*flawWatch]struct{}{},
		change: make(chan struct{}), release: make(chan struct{}),
	}
}

func (s *flawStore) is(flaw string) bool { return s.flaw == flaw }

// live returns key's record if it has not expired. s.mu is held.
func (s *flawStore) live(key string) *flawRec {
	r := s.locks[key]
	if r == nil || !time.Now().Before(r.expires) {
		return nil
	}
	return r
}

// serverTTL is how long the server keeps a lock granted with ttl.
func (s *flawStore) serverTTL(ttl time.Duration) time.Duration {
	switch {
	case s.is("never-expires"):
		return 24 * time.Hour
	case s.is("lost-late"):
		// Stands for a root that fires Lost late: the lock ends half way
		// through the TTL the holder counts on. Renewals every TTL/3 hide
		// it; a holder cut off shows it.
		return ttl / 2
	case s.is("min-ttl-not-honoured") && ttl <= flawCaps.MinTTL:
		return time.Millisecond
	case s.is("granularity-rounds-down"):
		ttl = ttl.Truncate(100 * time.Millisecond)
	case !s.is("honours-below-min"):
		ttl = flawCaps.RoundTTL(ttl)
	}
	m := flawCaps.Margin(ttl)
	if s.is("expires-before-margin") {
		return ttl - 2*m
	}
	return ttl - m/2
}

// arm (re)sets r's TTL. s.mu is held.
func (s *flawStore) arm(key string, r *flawRec, ttl time.Duration) {
	d := s.serverTTL(ttl)
	r.ttl, r.expires = ttl, time.Now().Add(d)
	if r.timer == nil {
		r.timer = time.AfterFunc(d, func() { s.expire(key, r) })
	} else {
		r.timer.Reset(d)
	}
}

func (s *flawStore) expire(key string, r *flawRec) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks[key] == r && !time.Now().Before(r.expires) {
		s.changed(key, false)
	}
}

// changed tells waiters, subscribers and watchers that key may have become
// free (released, or expired). s.mu is held.
func (s *flawStore) changed(key string, released bool) {
	close(s.change)
	s.change = make(chan struct{})
	if released {
		close(s.release)
		s.release = make(chan struct{})
	}
	for sub := range s.subs[key] {
		if s.is("waiter-never-wakes") || (s.is("waiter-no-expiry-wake") && !released) {
			continue
		}
		if s.is("waiter-wakes-once") && sub.sent.Load() > 0 {
			continue
		}
		sub.sent.Add(1)
		if s.is("waiter-wakes-late") {
			time.AfterFunc(1500*time.Millisecond, sub.wake)
		} else {
			sub.wake()
		}
	}
	if !s.quiet {
		s.checkWatches(key)
	}
	if released {
		s.notifyChanges(key, "release")
	}
}

// checkWatches reports lost to every watcher of key whose grant is no
// longer the live one. s.mu is held.
func (s *flawStore) checkWatches(key string) {
	if s.is("frees-on-cut") || s.is("lost-late") {
		return // they end locks their holders never hear of
	}
	cur := s.live(key)
	for w := range s.watches[key] {
		if cur == nil || cur.owner != w.owner || cur.token != w.token {
			w.fire("the grant ended")
		}
	}
}

// fireAll reports lost to every watcher of key. s.mu is held.
func (s *flawStore) fireAll(key, why string) {
	for w := range s.watches[key] {
		w.fire(why)
	}
}

// flawed is a small correct driver with one deliberate flaw, named by flaw.
// It implements every optional interface but BlockingAcquirer, which
// flawedBlocking adds.
type flawed struct {
	st      *flawStore
	mu      sync.Mutex
	closed  bool
	counter uint64        // tokens-per-locker
	scratch atomic.Value  // shared-scratch
	cut     chan struct{} // while cut off (Harness.Cut): closed at heal
	reset   bool          // the next call fails, as after a TCP reset
	// believed is what the client believes it holds, key to owner
	// (reset-reasserts: never forgotten, re-asserted after a reset).
	believed map[string]string
}

type flawedBlocking struct{ *flawed }

func (f *flawed) is(flaw string) bool { return f.st.is(flaw) }

// norm applies the key flaw.
func (f *flawed) norm(key string) string {
	if f.is("keys-case-insensitive") {
		return strings.ToLower(key)
	}
	return key
}

func (f *flawed) sameOwner(held, owner string) bool {
	if f.is("owner-prefix-compare") {
		return held[:min(64, len(held))] == owner[:min(64, len(owner))]
	}
	return held == owner
}

// out applies the error-text flaw to an error the driver returns.
func (f *flawed) out(err error) error {
	if err != nil && f.is("errors-prefixed-locker") {
		return fmt.Errorf("locker: flawed: %w", err)
	}
	return err
}

func (f *flawed) isClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

func (f *flawed) check(ctx context.Context, key string, ttl time.Duration, needTTL bool) error {
	if !f.is("ignores-context") {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("flawed: %w", err)
		}
	}
	switch {
	case f.isClosed():
		return driver.ErrClosed
	case key == "":
		return fmt.Errorf("flawed: %w: empty key", driver.ErrInvalid)
	case needTTL && ttl <= 0:
		return fmt.Errorf("flawed: %w: ttl %v", driver.ErrInvalid, ttl)
	}
	return f.gate(ctx)
}

// gate stages the faults of the Harness: a call through a Locker that is
// cut off waits for the heal or its context; one after a reset fails once;
// one during a restart fails with ErrUnavailable.
func (f *flawed) gate(ctx context.Context) error {
	f.mu.Lock()
	cut, reset := f.cut, f.reset
	f.reset = false
	f.mu.Unlock()
	if reset {
		if f.is("reset-reasserts") {
			f.reassert()
		}
		return errors.New("flawed: connection reset by peer")
	}
	if cut != nil && ctx.Done() != nil && ctx.Value(delivered{}) == nil {
		// A call without a context (WatchHold) starts a watch on what the
		// driver already has; it has nothing to wait for.
		select {
		case <-cut:
		case <-ctx.Done():
			return fmt.Errorf("flawed: cut off: %w", ctx.Err())
		}
	}
	f.st.mu.Lock()
	down := f.st.down
	f.st.mu.Unlock()
	if time.Now().Before(down) {
		return fmt.Errorf("flawed: %w: the server is restarting", driver.ErrUnavailable)
	}
	return nil
}

// delivered marks the context of a request that reached the server under
// a cut (its reply is what the cut loses).
type delivered struct{}

// lostReply is Acquire through a Locker that is cut off: the request
// reaches the server, and the reply waits for the heal. If ctx ends first
// the caller gets ctx's error (lost-reply-not-acquired: ErrNotAcquired),
// whatever the server did.
func (f *flawed) lostReply(ctx context.Context, cut <-chan struct{}, key, owner string, ttl time.Duration) (uint64, error) {
	tok, err := f.acquire(context.WithValue(ctx, delivered{}, true), key, owner, ttl, false)
	select {
	case <-cut:
		return tok, err
	case <-ctx.Done():
		if f.is("lost-reply-not-acquired") {
			return 0, fmt.Errorf("flawed: no reply: %w", driver.ErrNotAcquired)
		}
		return 0, fmt.Errorf("flawed: cut off: %w", ctx.Err())
	}
}

// resetConns is Harness.Reset: the next call fails.
// (watch-alarm-on-reset: f's watches report their locks lost.)
func (f *flawed) resetConns() {
	f.mu.Lock()
	f.reset = true
	f.mu.Unlock()
	if f.is("waiter-deaf-after-reset") {
		f.st.dropSubs(f) // the subscriptions' connection is not re-established
	}
	f.resetChanges()
	if f.is("watch-alarm-on-reset") {
		s := f.st
		s.mu.Lock()
		for _, ws := range s.watches {
			for w := range ws {
				if w.by == f {
					w.fire("the connection was reset")
				}
			}
		}
		s.mu.Unlock()
	}
}

// dropSubs forgets the subscriptions made through by, or every one when
// by is nil, without a word to their subscribers.
func (s *flawStore) dropSubs(by *flawed) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, subs := range s.subs {
		for sub := range subs {
			if by == nil || sub.by == by {
				delete(subs, sub)
			}
		}
	}
}

// reassert re-acquires, after a reset, every key the client believes it
// holds, over whoever holds it now (reset-reasserts).
func (f *flawed) reassert() {
	f.mu.Lock()
	held := maps.Clone(f.believed)
	f.mu.Unlock()
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, owner := range held {
		if old := s.locks[key]; old != nil && old.timer != nil {
			old.timer.Stop()
		}
		s.counter++
		r := &flawRec{owner: owner, token: s.counter, by: f}
		s.arm(key, r, 30*time.Second)
		s.locks[key] = r
	}
}

// cutOff is Harness.Cut. With frees-on-cut, the server frees f's locks at
// once and grants them to others, while their holder hears nothing.
func (f *flawed) cutOff() (func(), error) {
	ch := make(chan struct{})
	f.mu.Lock()
	f.cut = ch
	f.mu.Unlock()
	if f.is("frees-on-cut") {
		s := f.st
		s.mu.Lock()
		s.quiet = true
		for key, r := range s.locks {
			if r.by == f && s.live(key) != nil {
				r.timer.Stop()
				delete(s.locks, key)
				s.changed(key, true)
			}
		}
		s.quiet = false
		s.mu.Unlock()
	}
	return func() {
		f.mu.Lock()
		f.cut = nil
		f.mu.Unlock()
		if f.is("heal-reasserts") {
			f.reassert() // what it believes it holds, over whoever holds it now
		}
		close(ch)
	}, nil
}

// restart is Harness.Restart and, with empty, Harness.RestartEmpty: the
// server is down for 50ms; without its data, every lock is gone (and its
// watchers told, as a reconnecting driver would be) but the token counter
// survives, as DurableTokens promises, unless the flaw is
// empty-restart-resets-tokens.
func (s *flawStore) restart(empty bool) {
	const downtime = 50 * time.Millisecond
	if s.is("waiter-deaf-after-restart") {
		s.dropSubs(nil)
	}
	s.mu.Lock()
	s.down = time.Now().Add(downtime)
	if !empty && s.is("restart-renumbers-tokens") {
		// The tokens are kept apart from the locks, and not in the snapshot
		// the restart reloads: each lock comes back with a new one.
		for key := range s.locks {
			if r := s.live(key); r != nil {
				s.counter++
				r.token = s.counter
			}
		}
	}
	if empty {
		s.ghosts = map[string]*flawRec{}
		for key, r := range s.locks {
			r.timer.Stop()
			delete(s.locks, key)
			s.ghosts[key] = r // inspect-ghost-after-empty-restart
			if s.is("watch-misses-empty-restart") {
				continue // the watches never hear
			}
			s.fireAll(key, "the server restarted without its data")
			s.changed(key, false)
		}
		if s.is("empty-restart-resets-tokens") {
			s.counter = 0
			clear(s.perKey)
		}
	}
	s.mu.Unlock()
	time.Sleep(downtime)
}

// checkOptional is check for the optional interfaces' methods.
func (f *flawed) checkOptional(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("flawed: %w", err)
	}
	switch {
	case f.isClosed() && !f.is("closed-optional-calls-work"):
		return driver.ErrClosed
	case key == "":
		return fmt.Errorf("flawed: %w: empty key", driver.ErrInvalid)
	}
	return f.gate(ctx)
}

func (f *flawed) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if f.is("done-ctx-acquire-grants") {
		tok, err := f.acquire(context.WithoutCancel(ctx), key, owner, ttl, false)
		if err == nil && ctx.Err() != nil {
			return 0, fmt.Errorf("flawed: %w", ctx.Err())
		}
		return tok, f.out(err)
	}
	f.mu.Lock()
	cut := f.cut
	f.mu.Unlock()
	if cut != nil && ctx.Done() != nil {
		return f.lostReply(ctx, cut, key, owner, ttl)
	}
	for {
		ch := f.changes(false)
		tok, err := f.acquire(ctx, key, owner, ttl, false)
		if err == nil {
			f.believe(key, owner)
		}
		if !f.is("acquire-waits") || !errors.Is(err, driver.ErrNotAcquired) {
			return tok, f.out(err)
		}
		if err := waitOn(ctx, ch); err != nil {
			return 0, err
		}
	}
}

// believe records that the client holds key for owner; only Release
// forgets it, unless the flaw is reset-reasserts. Only the flaws
// reset-reasserts and heal-reasserts use it.
func (f *flawed) believe(key, owner string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.believed == nil {
		f.believed = map[string]string{}
	}
	f.believed[key] = owner
}

// changes returns the channel closed at the next release or expiry (the
// next release only, if releasesOnly). Taken before an attempt, it cannot
// miss a change that happens between the attempt and the wait.
func (f *flawed) changes(releasesOnly bool) <-chan struct{} {
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	if releasesOnly {
		return s.release
	}
	return s.change
}

func waitOn(ctx context.Context, ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flawed: %w", ctx.Err())
	}
}

func (f *flawed) acquire(ctx context.Context, key, owner string, ttl time.Duration, wait bool) (uint64, error) {
	if err := f.check(ctx, key, ttl, true); err != nil {
		return 0, err
	}
	key = f.norm(key)
	if f.is("shared-scratch") {
		// Arguments parked in a field of the Locker, as a driver reusing
		// one request buffer would: concurrent calls overwrite each other's.
		f.scratch.Store(owner)
		runtime.Gosched()
		time.Sleep(50 * time.Microsecond)
		owner = f.scratch.Load().(string)
	}
	if wait && f.is("blocking-ignores-ttl") {
		ttl = 300 * time.Millisecond
	}
	if !wait && f.is("acquire-fixed-ttl") {
		ttl = 300 * time.Millisecond
	}
	s := f.st
	s.mu.Lock()
	if r := s.live(key); r != nil && !(f.is("acquire-ignores-holder") && r.owner != owner) {
		defer s.mu.Unlock()
		mine := f.sameOwner(r.owner, owner) &&
			!(wait && f.is("blocking-waits-for-self")) &&
			!f.is("idempotent-refused") &&
			!((f.is("owner-bound-to-locker") || f.is("locker-bound-release-frees")) && r.by != f)
		if mine {
			if f.is("watch-alarm-on-own-change") && ttl != r.ttl {
				s.fireAll(key, "the TTL changed")
			}
			switch {
			case f.is("idempotent-keeps-ttl"):
			case f.is("idempotent-only-extends"):
				if time.Now().Add(s.serverTTL(ttl)).After(r.expires) {
					s.arm(key, r, ttl)
				}
			default:
				s.arm(key, r, ttl)
			}
			if f.is("idempotent-new-token") {
				s.counter++
				r.token = s.counter
			}
			return r.token, nil
		}
		if f.is("watch-false-alarm") {
			s.fireAll(key, "someone else tried to take the key")
		}
		if f.is("held-plain-error") {
			return 0, errors.New("flawed: the key is busy")
		}
		if f.is("waiter-no-expiry-wake") {
			// Neither a wake-up on expiry nor the remaining TTL.
			return 0, fmt.Errorf("flawed: %w", driver.ErrNotAcquired)
		}
		rem := time.Until(r.expires)
		if f.is("helderror-full-ttl") {
			rem = r.ttl
		}
		return 0, &driver.HeldError{Remaining: rem}
	}
	if f.is("check-then-set") {
		// The classic GET-then-SET: the key looked free; set it without
		// checking again.
		s.mu.Unlock()
		time.Sleep(200 * time.Microsecond)
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	old := s.locks[key]
	if old != nil && old.owner == owner && old.timer != nil && f.is("reacquire-revives-expired") {
		s.arm(key, old, ttl)
		return old.token, nil
	}
	var tok uint64
	switch {
	case f.is("tokens-repeat-after-expiry"):
		// A per-key counter that is lost when the lock expires, like a
		// counter key with the lock's TTL and no floor.
		if old != nil && !time.Now().Before(old.expires) {
			s.perKey[key] = 0
		}
		s.perKey[key]++
		tok = s.perKey[key]
	case f.is("tokens-reset-on-release"):
		// The counter lives in the lock record: a deleted key starts over.
		if old == nil {
			s.perKey[key] = 0
		}
		s.perKey[key]++
		tok = s.perKey[key]
	case f.is("tokens-per-locker"):
		f.counter++
		tok = f.counter
	default:
		s.counter++
		tok = s.counter
	}
	if old != nil && old.timer != nil {
		old.timer.Stop()
	}
	r := &flawRec{owner: owner, token: tok, by: f}
	s.arm(key, r, ttl)
	s.locks[key] = r
	s.checkWatches(key)
	s.notifyGrant(key, old)
	return tok, nil
}

func (f *flawed) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := f.check(ctx, key, ttl, !f.is("refresh-accepts-bad-ttl")); err != nil {
		if f.is("refresh-ok-on-timeout") && errors.Is(err, context.DeadlineExceeded) {
			return nil // a timed-out call taken for a success
		}
		return f.out(err)
	}
	key = f.norm(key)
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := f.lookup(key, "refresh-revives-expired")
	if r == nil && f.is("refresh-free-creates") {
		r = &flawRec{owner: owner, token: s.counter + 1, by: f}
		s.counter++
		s.arm(key, r, ttl)
		s.locks[key] = r
		return nil
	}
	if !f.holds(r, owner, "refresh-without-owner-check") {
		if r != nil && f.is("foreign-refresh-extends") {
			s.arm(key, r, ttl)
		}
		return f.out(f.notHeld())
	}
	if f.is("watch-alarm-on-own-change") && ttl != r.ttl {
		s.fireAll(key, "the TTL changed")
	}
	switch {
	case f.is("refresh-ignores-ttl"):
		s.arm(key, r, r.ttl)
	case f.is("refresh-only-extends"):
		if time.Now().Add(s.serverTTL(ttl)).After(r.expires) {
			s.arm(key, r, ttl)
		}
	case f.is("refresh-noop"):
	default:
		s.arm(key, r, ttl)
	}
	return nil
}

// RefreshBatch refreshes each item as Refresh does. Flaws:
// batch-foreign-extends extends the lock an item names even when another
// owner holds it (and still reports ErrNotHeld); batch-error-spreads fails
// every item once one is not held; batch-keeps-ttl refreshes a lock to the
// TTL it had; batch-ignores-context refreshes with a done context.
func (f *flawed) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	errs := make([]error, len(items))
	failed := false
	if f.is("batch-ignores-context") {
		ctx = context.WithoutCancel(ctx)
	}
	for i, it := range items {
		ttl := it.TTL
		if f.is("batch-keeps-ttl") {
			f.st.mu.Lock()
			if r := f.st.live(f.norm(it.Key)); r != nil {
				ttl = r.ttl
			}
			f.st.mu.Unlock()
		}
		errs[i] = f.Refresh(ctx, it.Key, it.Owner, ttl)
		failed = failed || errors.Is(errs[i], driver.ErrNotHeld)
		if errs[i] != nil && f.is("batch-foreign-extends") && it.Key != "" && it.TTL > 0 {
			s := f.st
			s.mu.Lock()
			if r := s.live(f.norm(it.Key)); r != nil {
				s.arm(f.norm(it.Key), r, it.TTL)
			}
			s.mu.Unlock()
		}
	}
	if failed && f.is("batch-error-spreads") {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = f.out(f.notHeld())
			}
		}
	}
	return errs
}

// lookup returns key's live record; with expiredFlaw on, an expired one
// too. f.st.mu is held.
func (f *flawed) lookup(key, expiredFlaw string) *flawRec {
	if f.is(expiredFlaw) {
		return f.st.locks[key]
	}
	return f.st.live(key)
}

// holds reports whether owner holds r (through f); with anyOwnerFlaw on,
// whoever asks does.
func (f *flawed) holds(r *flawRec, owner, anyOwnerFlaw string) bool {
	bound := f.is("owner-bound-to-locker") || f.is("locker-bound-release-frees")
	return r != nil && (f.sameOwner(r.owner, owner) || f.is(anyOwnerFlaw)) && !(bound && r.by != f)
}

func (f *flawed) notHeld() error {
	if f.is("notheld-plain-error") {
		return errors.New("flawed: not held")
	}
	return driver.ErrNotHeld
}

func (f *flawed) Release(ctx context.Context, key, owner string) error {
	if key == "" && f.is("release-empty-key-not-invalid") {
		key = "\x00empty"
	}
	if err := f.check(ctx, key, 0, false); err != nil {
		return f.out(err)
	}
	key = f.norm(key)
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := f.lookup(key, "release-expired-returns-nil")
	// A LockerBound driver whose Release still frees the key for the same
	// owner through another Locker.
	leak := f.is("locker-bound-release-frees") && r != nil && f.sameOwner(r.owner, owner)
	if !f.holds(r, owner, "release-without-owner-check") && !leak {
		if r == nil && f.is("release-free-returns-nil") {
			return nil
		}
		return f.out(f.notHeld())
	}
	if f.is("release-noop") {
		return nil
	}
	if f.is("watch-alarm-on-release") {
		s.fireAll(key, "released")
	}
	for w := range s.watches[key] {
		if w.owner == r.owner && w.token == r.token {
			delete(s.watches[key], w) // the owner's own release is not a loss
		}
	}
	if !f.is("reset-reasserts") {
		f.mu.Lock()
		delete(f.believed, key)
		f.mu.Unlock()
	}
	r.timer.Stop()
	delete(s.locks, key)
	s.changed(key, true)
	return nil
}

func (f *flawed) Close() error {
	f.mu.Lock()
	was := f.closed
	f.closed = true
	f.mu.Unlock()
	if was && f.is("close-twice-errors") {
		return errors.New("flawed: already closed")
	}
	if f.is("close-keeps-renewing") {
		s := f.st
		s.mu.Lock()
		for key, r := range s.locks {
			if r.by == f && s.live(key) != nil {
				r.expires = time.Now().Add(24 * time.Hour)
				r.timer.Stop()
			}
		}
		s.mu.Unlock()
	}
	return nil
}

func (f *flawed) Capabilities() driver.Capabilities {
	c := flawCaps
	c.LockerBound = f.is("locker-bound-release-frees")
	return c
}

func (f *flawed) Ping(ctx context.Context) error {
	if err := f.checkOptional(ctx, "-"); err != nil {
		return f.out(err)
	}
	if f.is("ping-fails") {
		return fmt.Errorf("flawed: %w: no route to the server", driver.ErrUnavailable)
	}
	return nil
}

func (f *flawed) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := f.checkOptional(ctx, key); err != nil {
		return driver.Info{}, f.out(err)
	}
	key = f.norm(key)
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := f.lookup(key, "inspect-sees-expired")
	if g := s.ghosts[key]; r == nil && g != nil && f.is("inspect-ghost-after-empty-restart") && time.Now().Before(g.expires) {
		r = g // Inspect reads a replica the restart did not empty
	}
	if r == nil {
		if f.is("inspect-free-not-notheld") {
			return driver.Info{}, nil
		}
		return driver.Info{}, f.out(driver.ErrNotHeld)
	}
	if f.is("inspect-extends") {
		s.arm(key, r, r.ttl)
	}
	tok := r.token
	if f.is("inspect-wrong-token") {
		tok++
	}
	return driver.Info{Owner: r.owner, Token: tok, Remaining: time.Until(r.expires)}, nil
}

type flawSub struct {
	ch   chan struct{}
	sent atomic.Int32
	by   *flawed // the Locker that subscribed
}

func (sub *flawSub) wake() {
	select {
	case sub.ch <- struct{}{}:
	default:
	}
}

func (f *flawed) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if !f.is("subscribe-ignores-ctx") {
		if err := f.checkOptional(ctx, key); err != nil {
			return nil, nil, f.out(err)
		}
	} else if err := f.checkOptional(context.Background(), key); err != nil {
		return nil, nil, f.out(err)
	}
	key = f.norm(key)
	sub := &flawSub{ch: make(chan struct{}, 1), by: f}
	if f.is("waiter-unbuffered") {
		sub.ch = make(chan struct{})
	}
	s := f.st
	register := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.subs[key] == nil {
			s.subs[key] = map[*flawSub]struct{}{}
		}
		s.subs[key][sub] = struct{}{}
	}
	if f.is("subscribe-registers-late") {
		time.AfterFunc(200*time.Millisecond, register)
	} else {
		register()
	}
	stopStorm := make(chan struct{})
	if f.is("waiter-storm") {
		go func() {
			tk := time.NewTicker(20 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-tk.C:
					sub.wake()
				case <-stopStorm:
					return
				}
			}
		}()
	}
	var once sync.Once
	cancel := func() {
		if f.is("waiter-cancel-noop") {
			return
		}
		once.Do(func() {
			close(stopStorm)
			s.mu.Lock()
			delete(s.subs[key], sub)
			s.mu.Unlock()
		})
	}
	return sub.ch, cancel, nil
}

func (f flawedBlocking) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	waitCtx := ctx
	if f.is("blocking-ignores-ctx") {
		waitCtx = context.WithoutCancel(ctx)
	}
	waited := false
	start := time.Now()
	for {
		ch := f.changes(f.is("blocking-no-expiry"))
		tok, err := f.acquire(waitCtx, key, owner, ttl, true)
		if err == nil {
			if waited && f.is("blocking-late") {
				time.Sleep(1500 * time.Millisecond)
			}
			return tok, nil
		}
		if !errors.Is(err, driver.ErrNotAcquired) {
			return 0, f.out(err)
		}
		waited = true
		if f.is("blocking-grants-while-held") {
			if time.Since(start) > 300*time.Millisecond {
				// Gives up waiting and takes the key over.
				s := f.st
				s.mu.Lock()
				if r := s.live(f.norm(key)); r != nil {
					r.expires = time.Now()
				}
				s.mu.Unlock()
				continue
			}
			select {
			case <-ch:
			case <-time.After(50 * time.Millisecond):
			case <-waitCtx.Done():
				return 0, fmt.Errorf("flawed: %w", waitCtx.Err())
			}
			continue
		}
		if err := waitOn(waitCtx, ch); err != nil {
			if f.is("blocking-stays-queued") {
				// The wait stays queued on the server after its caller
				// gave up, whatever becomes of the client (even closed),
				// and takes the key when it frees.
				server := flawedBlocking{&flawed{st: f.st}}
				go func() { _, _ = server.AcquireWait(context.Background(), key, owner, ttl) }()
			}
			return 0, err
		}
	}
}

type flawWatch struct {
	owner string
	token uint64
	lost  func(error)
	flaw  string
	once  sync.Once
	mu    sync.Mutex // held while lost runs (watch-stop-waits-for-lost)
	stops chan struct{}
	by    *flawed // the Locker that watches
}

func (w *flawWatch) fire(why string) {
	call := func() {
		err := fmt.Errorf("flawed: %w: %s", driver.ErrNotHeld, why)
		if w.flaw == "watch-lost-plain-error" {
			err = errors.New("flawed: " + why)
		}
		go func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.lost(err)
		}()
	}
	if w.flaw == "watch-lost-twice" {
		// Two sources of news (an event and a re-check), not deduplicated.
		call()
		call()
		return
	}
	w.once.Do(call)
}

func (f *flawed) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	if err := f.checkOptional(context.Background(), key); err != nil {
		return nil, f.out(err)
	}
	key = f.norm(key)
	w := &flawWatch{owner: owner, token: token, lost: lost, flaw: f.st.flaw, stops: make(chan struct{}), by: f}
	s := f.st
	s.mu.Lock()
	if s.watches[key] == nil {
		s.watches[key] = map[*flawWatch]struct{}{}
	}
	s.watches[key][w] = struct{}{}
	if r := s.live(key); r == nil || r.owner != owner || r.token != token {
		w.fire("not held when the watch started")
	} else if f.is("watch-early-alarm") {
		// Presumes the lock lost half way through its TTL.
		time.AfterFunc(r.ttl/2, func() { w.fire("half the TTL passed") })
	}
	s.mu.Unlock()
	var once sync.Once
	stop := func() {
		if f.is("watch-stop-waits-for-lost") {
			w.mu.Lock()
			defer w.mu.Unlock()
		}
		if f.is("watch-stop-twice-panics") {
			close(w.stops)
		} else {
			once.Do(func() { close(w.stops) })
		}
		s.mu.Lock()
		delete(s.watches[key], w)
		s.mu.Unlock()
	}
	return stop, nil
}
