package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// electionSubtests lists the checks of package locker's leader election
// over the driver (trace rows EL1–EL8). Elections need a driver.Inspector:
// without one, none is run (probe says so).
func (s *suite) electionSubtests() []subtest {
	if !s.has["Inspector"] {
		return nil
	}
	return []subtest{
		{name: "ElectionOneLeader", fn: s.electionOneLeader},
		{name: "ElectionTerms", fn: s.electionTerms},
		{name: "ElectionNoPhantom", fn: s.electionNoPhantom},
		{name: "ElectionValue", fn: s.electionValue},
		{name: "ElectionObserve", fn: s.electionObserve},
		{name: "ElectionResign", fn: s.electionResign, needs: "Waiter|BlockingAcquirer"},
		{name: "ElectionBadInput", fn: s.electionBadInput},
	}
}

// observeBound bounds how long after a grant or a resign an observer may
// report it: Observe reads the holder at least every 100ms; the rest is
// slack for a loaded machine (as wakeBound).
const observeBound = time.Second

// oneLeaderWindow is how long ElectionOneLeader contends at least; it goes
// on until it has seen minTerms terms, for at most 10 windows.
const (
	oneLeaderWindow = 500 * time.Millisecond
	minTerms        = 3
)

// believers tracks the leaders of one election that believe they lead:
// each fn of Lead from its start until its context is done.
type believers struct {
	mu         sync.Mutex
	active     map[*belief]struct{}
	terms      []uint64
	violations []string
}

type belief struct {
	who  string
	term uint64
	ctx  context.Context
}

// enter records b and checks that no other leader still believes it leads.
// It runs after b's grant: an earlier leader whose context is still open
// now believed it led while b was elected.
func (bs *believers) enter(b *belief) {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for o := range bs.active {
		if o.ctx.Err() == nil {
			bs.violations = append(bs.violations, fmt.Sprintf("%s was elected (term %d) while %s (term %d) still led: its fn's context was open",
				b.who, b.term, o.who, o.term))
		}
	}
	bs.active[b] = struct{}{}
	bs.terms = append(bs.terms, b.term)
}

func (bs *believers) leave(b *belief) {
	bs.mu.Lock()
	delete(bs.active, b)
	bs.mu.Unlock()
}

func (bs *believers) count() int {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	return len(bs.terms)
}

// EL1: several candidates Lead one election; never two fns whose contexts
// are open at once. Each leader resigns after a short term, so that terms
// change hands; it contends until it has seen minTerms terms (a loaded
// backend may be slow to hand over), for at most 10 windows.
func (s *suite) electionOneLeader(t *testing.T) {
	name := newKey(t)
	bs := &believers{active: map[*belief]struct{}{}}
	ctx, stop := context.WithCancel(s.callCtx(t))
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for i := range 3 {
		l := s.locker(t)
		who := fmt.Sprintf("candidate %d", i)
		wg.Go(func() {
			errs <- l.Election(name).Lead(ctx, who, func(fctx context.Context, term uint64) error {
				b := &belief{who: who, term: term, ctx: fctx}
				bs.enter(b)
				defer bs.leave(b)
				pause(fctx, rand.N(s.unit/4)+time.Millisecond)
				return nil
			}, locker.WithTTL(s.unit))
		})
	}
	start := time.Now()
	for time.Since(start) < oneLeaderWindow || bs.count() < minTerms {
		if time.Since(start) > 10*oneLeaderWindow+2*s.unit {
			break
		}
		pause(ctx, 5*time.Millisecond)
	}
	stop()
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Lead returned %v, want an error matching context.Canceled", err)
		}
	}
	for _, v := range bs.violations {
		t.Errorf("two leaders: %s", v)
	}
	if n := bs.count(); n < minTerms {
		t.Fatalf("only %d terms in %v with 3 candidates resigning after at most %v each", n, time.Since(start).Round(time.Millisecond), s.unit/4)
	}
	for i := 1; i < len(bs.terms); i++ {
		if bs.terms[i] <= bs.terms[i-1] {
			t.Fatalf("term %d after term %d", bs.terms[i], bs.terms[i-1])
		}
	}
	t.Logf("%d terms in %v", len(bs.terms), time.Since(start).Round(time.Millisecond))
}

// EL2: terms strictly increase across a resign and across a leader's
// expiry, and Leader reports the current term.
func (s *suite) electionTerms(t *testing.T) {
	la, lb, lc := s.locker(t), s.locker(t), s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	leader := func(want *locker.Lock, value string) {
		t.Helper()
		ld, err := leaderOf(ctx, lc.Election(name))
		if err != nil || ld.Term != want.Token() || ld.Value != value {
			t.Fatalf("Leader: %+v %v, want %q at term %d", ld, err, value, want.Token())
		}
	}
	a, err := campaign(ctx, la.Election(name), "a", locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	leader(a, "a")
	if err := a.Release(ctx); err != nil {
		t.Fatalf("resign: %v", err)
	}
	b, err := campaign(ctx, lb.Election(name), "b", locker.WithTTL(s.unit), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatalf("Campaign after a resign: %v", err)
	}
	if b.Token() <= a.Token() {
		t.Fatalf("term %d after a resign is not greater than term %d", b.Token(), a.Token())
	}
	leader(b, "b")
	// b is not renewed: the next candidate is elected once b's lease ends.
	c, err := campaign(ctx, la.Election(name), "c", locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Campaign after an expiry: %v", err)
	}
	defer c.Release(ctx)
	notBefore(t, "a candidate was elected", time.Now(), b.Deadline())
	if c.Token() <= b.Token() {
		t.Fatalf("term %d after an expiry is not greater than term %d", c.Token(), b.Token())
	}
	leader(c, "c")
}

// EL3: a leader whose lease runs out (renewal off) has its fn's context
// cancelled before another candidate is elected. The leader writes, while
// its context is open, a stamp taken before each check; no stamp may come
// after the other candidate's Campaign returned. Stamps after fn's start
// plus the TTL less the margin are not counted: the safe deadline is
// earlier, and a late timer on a loaded machine is not the driver's fault.
// Its Lead is stopped once it has lost, so that it cannot campaign again
// and win before the other candidate (a backend that does not queue
// waiters may let it).
func (s *suite) electionNoPhantom(t *testing.T) {
	la, lb := s.locker(t), s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	actx, stopA := context.WithCancel(ctx)
	defer stopA()
	elected := make(chan uint64, 1)
	ttl := max(s.unit, 500*time.Millisecond)
	var mu sync.Mutex
	var last time.Time  // A's last stamp taken while it believed it led
	var capAt time.Time // fn's start plus the TTL less the margin
	leadErr := make(chan error, 1)
	go func() {
		leadErr <- la.Election(name).Lead(actx, "a", func(fctx context.Context, term uint64) error {
			defer stopA() // lost (or ended): do not campaign again
			mu.Lock()
			capAt = time.Now().Add(s.effective(ttl) - s.margin(s.effective(ttl)))
			mu.Unlock()
			select {
			case elected <- term:
			default:
				return fmt.Errorf("elected again (term %d)", term)
			}
			tick := time.NewTicker(max(s.unit/100, time.Millisecond))
			defer tick.Stop()
			for {
				at := time.Now()
				if fctx.Err() != nil {
					return nil
				}
				mu.Lock()
				last = at
				mu.Unlock()
				<-tick.C
			}
		}, locker.WithTTL(ttl), locker.WithAutoRenew(false))
	}()
	var termA uint64
	select {
	case termA = <-elected:
	case err := <-leadErr:
		t.Fatalf("Lead: %v", err)
	case <-ctx.Done():
		t.Fatal("the first candidate was never elected")
	}
	b, err := campaign(ctx, lb.Election(name), "b", locker.WithTTL(s.hold()))
	bEnd := time.Now()
	if err != nil {
		t.Fatalf("Campaign of the second candidate: %v", err)
	}
	defer b.Release(ctx)
	if err := <-leadErr; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the first leader's Lead: %v", err)
	}
	mu.Lock()
	if last.After(capAt) {
		last = capAt
	}
	over := last.Sub(bEnd)
	mu.Unlock()
	if over > 0 {
		t.Fatalf("the first leader (term %d) still believed it led %v after the second (term %d) was elected", termA, over, b.Token())
	}
	if b.Token() <= termA {
		t.Fatalf("term %d after term %d", b.Token(), termA)
	}
	t.Logf("the first leader's last write came %v before the second was elected", -over)
}

// electionValues returns values to campaign with: odd bytes where the
// driver keeps any, and the longest the election accepts on l.
func (s *suite) electionValues(e *locker.Election) []string {
	longest := e.MaxValue()
	vs := []string{"", "10.0.0.7:8080", "a value/with spaces:and{braces}~"}
	if !s.caps.OwnerASCII {
		vs = append(vs, "\x00\xff é\n/", strings.Repeat("é", longest/2))
	}
	if longest > 0 {
		b := make([]byte, longest)
		for i := range b {
			b[i] = byte(' ' + i%95)
		}
		vs = append(vs, string(b))
	}
	return slices.DeleteFunc(vs, func(v string) bool { return len(v) > longest })
}

// EL4: the leader's value, whatever its bytes and up to the longest the
// election accepts on the driver, is what another Locker sees.
func (s *suite) electionValue(t *testing.T) {
	la, lb := s.locker(t), s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	e := la.Election(name)
	for _, v := range s.electionValues(e) {
		lk, err := campaign(ctx, e, v, locker.WithTTL(s.hold()))
		if err != nil {
			t.Fatalf("Campaign with a %d-byte value %q: %v", len(v), v, err)
		}
		ld, err := lb.Election(name).Leader(ctx)
		_ = lk.Release(ctx)
		if err != nil || ld.Value != v || ld.Term != lk.Token() {
			t.Fatalf("Leader through another Locker: %+v %v, want the %d-byte value %q at term %d", ld, err, len(v), v, lk.Token())
		}
	}
}

// seen is one report of an observer.
type seen struct {
	ld locker.Leader
	at time.Time
}

// observe runs Observe on l until ctx ends, sending what it yields.
func observe(ctx context.Context, t *testing.T, e *locker.Election, out chan<- seen) {
	for ld, err := range e.Observe(ctx) {
		if err != nil {
			// Observe goes on after an error reading the holder; a
			// lasting one shows as a report that comes too late.
			t.Logf("Observe: %v", err)
			continue
		}
		select {
		case out <- seen{ld, time.Now()}:
		case <-ctx.Done():
			return
		}
	}
}

// EL5, EL6: an observer reports the current leader (none) at once, then
// each new leader, with its value and term, and each resign, within
// observeBound; terms only increase, and one leader never shows under two
// terms.
func (s *suite) electionObserve(t *testing.T) {
	lo := s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	octx, stop := context.WithCancel(ctx)
	ch := make(chan seen, 64)
	var wg sync.WaitGroup
	wg.Go(func() { observe(octx, t, lo.Election(name), ch) })
	defer wg.Wait()
	defer stop()
	var high uint64
	next := func(what string, since time.Time) locker.Leader {
		t.Helper()
		select {
		case r := <-ch:
			if d := r.at.Sub(since); d > observeBound {
				t.Errorf("observer reported %s %v after it happened, over %v", what, d.Round(time.Millisecond), observeBound)
			}
			if r.ld.Term != 0 && r.ld.Term <= high {
				t.Fatalf("observer reported term %d after term %d", r.ld.Term, high)
			}
			high = max(high, r.ld.Term)
			return r.ld
		case <-time.After(observeBound + quick):
			t.Fatalf("observer did not report %s within %v", what, observeBound+quick)
		}
		return locker.Leader{}
	}
	if ld := next("the start", time.Now()); ld != (locker.Leader{}) {
		t.Fatalf("first report %+v, want nobody", ld)
	}
	for i := range 3 {
		l := s.locker(t)
		v := fmt.Sprintf("leader %d", i)
		lk, err := campaign(ctx, l.Election(name), v, locker.WithTTL(s.hold()))
		if err != nil {
			t.Fatalf("Campaign: %v", err)
		}
		if ld := next("a new leader", time.Now()); ld.Value != v || ld.Term != lk.Token() {
			t.Fatalf("observer reported %+v, want %q at term %d", ld, v, lk.Token())
		}
		at := time.Now()
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("resign: %v", err)
		}
		if ld := next("a resign", at); ld != (locker.Leader{}) {
			t.Fatalf("after a resign the observer reported %+v, want nobody", ld)
		}
	}
	stop()
	for _, r := range drain(ch) {
		if r.ld.Term != 0 {
			t.Fatalf("observer reported %+v after the last resign", r.ld)
		}
	}
}

// drain returns what is buffered in ch.
func drain(ch chan seen) []seen {
	var out []seen
	for {
		select {
		case r := <-ch:
			out = append(out, r)
		default:
			return out
		}
	}
}

// EL7: a resign elects the waiting candidate within wakeBound, by
// Release and by fn returning an error from Lead (which resigns, then
// returns it). The leader's TTL is long, so only the resign explains the
// handoff. Run only for drivers with a Waiter or a BlockingAcquirer, as
// Locker/WokenByRelease.
func (s *suite) electionResign(t *testing.T) {
	la, lb := s.locker(t), s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	type res struct {
		lk  *locker.Lock
		err error
		at  time.Time
	}
	waiter := func() chan res {
		got := make(chan res, 1)
		go func() {
			lk, err := campaign(ctx, lb.Election(name), "b", locker.WithTTL(s.hold()))
			got <- res{lk, err, time.Now()}
		}()
		return got
	}
	handed := func(got chan res, resigned time.Time, how string) {
		t.Helper()
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("waiting Campaign: %v", r.err)
			}
			notBefore(t, "the waiting candidate was elected", r.at, resigned)
			t.Logf("elected %v after %s", r.at.Sub(resigned).Round(time.Microsecond), how)
			_ = r.lk.Release(ctx)
		case <-time.After(wakeBound):
			t.Fatalf("the waiting candidate was not elected within %v of %s", wakeBound, how)
		}
	}
	a, err := campaign(ctx, la.Election(name), "a", locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	got := waiter()
	time.Sleep(50 * time.Millisecond) // most likely waiting by now; either way it must be elected
	resigned := time.Now()
	if err := a.Release(ctx); err != nil {
		t.Fatalf("resign: %v", err)
	}
	handed(got, resigned, "a Release")

	errDone := errors.New("done")
	elected := make(chan struct{})
	var returned time.Time
	leadErr := make(chan error, 1)
	go func() {
		leadErr <- la.Election(name).Lead(ctx, "a", func(context.Context, uint64) error {
			close(elected)
			<-time.After(50 * time.Millisecond)
			returned = time.Now()
			return errDone
		}, locker.WithTTL(s.hold()))
	}()
	select {
	case <-elected:
	case <-ctx.Done():
		t.Fatal("Lead was never elected")
	}
	got = waiter()
	if err := <-leadErr; !errors.Is(err, errDone) {
		t.Fatalf("Lead returned %v, want fn's error", err)
	}
	handed(got, returned, "fn returning from Lead")
}

// EL8: bad input fails with ErrInvalid and leaves nothing held: an empty
// name, WithOwner, a value longer than the election accepts on the driver
// (or not printable ASCII where the driver declares OwnerASCII); Lead
// with a nil fn panics.
func (s *suite) electionBadInput(t *testing.T) {
	l := s.locker(t)
	name := newKey(t)
	ctx := s.callCtx(t)
	e := l.Election(name)
	fn := func(context.Context, uint64) error { return nil }
	calls := map[string]func() error{
		"Campaign with an empty name": func() error { return second(l.Election("").Campaign(ctx, "v")) },
		"Lead with an empty name":     func() error { return l.Election("").Lead(ctx, "v", fn) },
		"Leader with an empty name":   func() error { return second(l.Election("").Leader(ctx)) },
		"Observe with an empty name": func() error {
			for _, err := range l.Election("").Observe(ctx) {
				return err
			}
			return nil
		},
		"Campaign with WithOwner": func() error { return second(e.Campaign(ctx, "v", locker.WithOwner("o"))) },
		"Campaign with TTL 0":     func() error { return second(e.Campaign(ctx, "v", locker.WithTTL(0))) },
		"Campaign with a value one byte too long": func() error {
			return second(e.Campaign(ctx, strings.Repeat("v", max(e.MaxValue(), 0)+1)))
		},
		"Lead with a value one byte too long": func() error {
			return e.Lead(ctx, strings.Repeat("v", max(e.MaxValue(), 0)+1), fn)
		},
	}
	if s.caps.OwnerASCII {
		calls["Campaign with a value that is not printable ASCII"] = func() error { return second(e.Campaign(ctx, "é")) }
	}
	for what, call := range calls {
		wantErr(t, what, call(), locker.ErrInvalid)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Lead with a nil fn did not panic")
			}
		}()
		_ = e.Lead(ctx, "v", nil)
	}()
	// A transient error reading the holder is retried.
	deadline := time.Now().Add(quick)
	for {
		ld, err := e.Leader(ctx)
		if errors.Is(err, locker.ErrNotHeld) {
			return
		}
		if err == nil || time.Now().After(deadline) {
			t.Fatalf("Leader after refused campaigns: %+v %v, want an error matching ErrNotHeld (something was left held)", ld, err)
		}
		pause(ctx, 10*time.Millisecond)
	}
}

// campaign is Campaign, retried for up to quick on an error that is neither
// ErrInvalid nor ctx's: a transient error of the backend (a Redlock node
// slower than its node_timeout on a loaded machine) is not what the
// election's subtests check, and a failed Campaign leaves nothing held.
func campaign(ctx context.Context, e *locker.Election, value string, opts ...locker.Option) (*locker.Lock, error) {
	deadline := time.Now().Add(quick)
	for {
		lk, err := e.Campaign(ctx, value, opts...)
		if err == nil || errors.Is(err, locker.ErrInvalid) || ctx.Err() != nil || time.Now().After(deadline) {
			return lk, err
		}
		pause(ctx, 10*time.Millisecond)
	}
}

// leaderOf is e.Leader, asked again for up to quick after a transient
// backend error (ErrUnavailable: a node that missed its timeout on a
// loaded machine), as campaign does for Campaign.
func leaderOf(ctx context.Context, e *locker.Election) (locker.Leader, error) {
	deadline := time.Now().Add(quick)
	for {
		ld, err := e.Leader(ctx)
		if !errors.Is(err, locker.ErrUnavailable) || ctx.Err() != nil || time.Now().After(deadline) {
			return ld, err
		}
		pause(ctx, 10*time.Millisecond)
	}
}

// second returns the error of a two-value call.
func second[T any](_ T, err error) error { return err }
