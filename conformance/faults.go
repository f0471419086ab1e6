package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// FaultTimeEnv names the environment variable that sets how long each fault
// subtest runs its contenders, as a time.Duration ("30s"). The default is 8
// units, at least 2s: enough for a few faults each, short enough for a test
// run. scripts/faults sets it longer for the published matrix. A run goes
// on past it (up to four times as long) until the key and the shared track
// have each been granted once.
const FaultTimeEnv = "LOCKER_CONFORMANCE_FAULT_TIME"

// contenders is how many Lockers contend for the key in a fault subtest.
const contenders = 3

// faultSubtests returns the fault subtests whose hooks the Harness sets.
func (s *suite) faultSubtests() []subtest {
	var subs []subtest
	add := func(name string, set bool, inject func(context.Context, *testing.T, *history) error) {
		if set {
			subs = append(subs, subtest{name: name, fn: func(t *testing.T) { s.faultRun(t, name, inject) }})
		}
	}
	add("Cut", s.h.Cut != nil, s.injectCut)
	add("Reset", s.h.Reset != nil, s.injectReset)
	add("Restart", s.h.Restart != nil, func(ctx context.Context, t *testing.T, h *history) error {
		return s.injectRestart(ctx, h, s.h.Restart, false)
	})
	add("RestartEmpty", s.h.RestartEmpty != nil, func(ctx context.Context, t *testing.T, h *history) error {
		return s.injectRestart(ctx, h, s.h.RestartEmpty, true)
	})
	add("Pause", s.h.Pause, s.injectPause)
	return subs
}

// faultTime is how long each fault subtest runs.
func (s *suite) faultTime(t *testing.T) time.Duration {
	if v := os.Getenv(FaultTimeEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("conformance: %s=%q: want a positive duration such as 30s", FaultTimeEnv, v)
		}
		return d
	}
	return max(8*s.unit, 2*time.Second)
}

// faultRun runs one fault subtest: contenders Lockers take turns holding
// one key and writing to a fenced register while inject stages the fault,
// then the history is checked.
func (s *suite) faultRun(t *testing.T, fault string, inject func(context.Context, *testing.T, *history) error) {
	key := newKey(t)
	h := &history{key: key, ttl: s.unit}
	run := s.faultTime(t)
	ctx, stop := context.WithTimeout(context.Background(), faultRunCap*run)
	defer stop()
	var wg sync.WaitGroup
	h.lockers = make([]*locker.Locker, contenders)
	for i := range contenders {
		h.lockers[i] = s.locker(t)
	}
	for i := range contenders {
		wg.Go(func() { s.contend(ctx, fmt.Sprintf("L%d", i), h.lockers[i], h) })
	}
	s.startElections(ctx, &wg, h)
	s.startShared(ctx, &wg, h)
	wg.Go(func() {
		h.waitGranted(ctx, run)
		stop()
	})
	injErr := make(chan error, 1)
	wg.Go(func() {
		err := inject(ctx, t, h)
		if err != nil {
			stop() // a hook that fails ends the subtest now
		}
		injErr <- err
	})
	wg.Wait()
	if err := <-injErr; err != nil {
		t.Fatalf("fault hook %s failed: %v", fault, err)
	}
	s.checkHistory(t, fault, h)
	s.checkElections(t, fault, h)
	s.checkShared(t, fault, h)
}

// faultRunCap bounds a fault subtest's run, in fault times: the run goes
// on past its fault time until the mutex and the shared track (if any)
// have each been granted once, so that on a loaded machine, where the
// faults can outpace the first grants, the run still checks something.
// A track with no grant by the cap fails the subtest.
const faultRunCap = 4

// waitGranted returns once run has passed and the mutex and the shared
// track have each been granted at least once, or when ctx ends.
func (h *history) waitGranted(ctx context.Context, run time.Duration) {
	t := time.NewTimer(run)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if h.granted() {
			return
		}
		t.Reset(10 * time.Millisecond) // polling the histories, bounded by ctx
	}
}

// granted reports whether the mutex, and the shared track if it runs,
// have been granted at least once.
func (h *history) granted() bool {
	h.mu.Lock()
	n := len(h.grants)
	h.mu.Unlock()
	if n == 0 {
		return false
	}
	if h.sh == nil || !h.sh.on {
		return true
	}
	h.sh.mu.Lock()
	defer h.sh.mu.Unlock()
	return len(h.sh.grants) > 0
}

// history is what the contenders of one fault subtest did.
type history struct {
	key     string
	ttl     time.Duration
	lockers []*locker.Locker
	el      *etrack // the election track (tracks.go)
	sh      *strack // the shared-hold track (sharedtrack.go)

	mu       sync.Mutex
	grants   []*hgrant
	cur      *hgrant // the grant whose holder believes it holds now, if any
	faults   []hfault
	ops      int
	empties  []time.Time // when each data-losing restart began
	resumeLs []time.Duration
}

// hgrant is one grant of the key, as its holder saw it.
type hgrant struct {
	who        string
	token      uint64
	start, end time.Time // the Acquire call
	lost       time.Time // when Lost closed; zero if it did not
	released   time.Time // when Release was called; zero if it was not
	deadline   time.Time // the lock's safe deadline when it ended (a child: the last it reported)
	cause      string
	writes     []hwrite
}

// beliefEnd is when the holder stopped believing it held the key: Lost
// closed, it called Release, or (a child, which cannot hear while paused)
// its last reported safe deadline passed.
func (g *hgrant) beliefEnd(stop time.Time) time.Time {
	end := stop
	for _, t := range []time.Time{g.lost, g.released, g.deadline} {
		if !t.IsZero() && t.Before(end) {
			end = t
		}
	}
	return end
}

type hwrite struct {
	token uint64
	at    time.Time
}

// hfault is one injected fault: when, and the grant its target held then.
type hfault struct {
	at     time.Time
	target *hgrant
}

func (h *history) add(g *hgrant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.grants = append(h.grants, g)
	h.cur = g
}

func (h *history) op() {
	h.mu.Lock()
	h.ops++
	h.mu.Unlock()
}

func (h *history) fault(target *hgrant) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, hfault{at: time.Now(), target: target})
}

// holder returns the grant believed held now and the Locker holding it.
func (h *history) holder() (*hgrant, *locker.Locker) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.cur
	if g == nil || !g.lost.IsZero() || !g.released.IsZero() {
		return nil, nil
	}
	for i, l := range h.lockers {
		if g.who == fmt.Sprintf("L%d", i) {
			return g, l
		}
	}
	return g, nil
}

// contend takes the key, writes to the register while it holds, releases,
// and again, until ctx ends.
func (s *suite) contend(ctx context.Context, who string, l *locker.Locker, h *history) {
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, 4*s.unit)
		start := time.Now()
		lk, err := l.Acquire(actx, h.key, locker.WithTTL(s.unit))
		end := time.Now()
		cancel()
		h.op()
		if err != nil {
			// A backend that is down fails at once: do not spin.
			pause(ctx, s.unit/10)
			continue
		}
		g := &hgrant{who: who, token: lk.Token(), start: start, end: end}
		h.add(g)
		s.keep(ctx, lk, g, &h.mu, true)
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// every calls fn at random intervals of about gap until ctx ends, or fn
// fails.
func every(ctx context.Context, gap time.Duration, fn func() error) error {
	for {
		pause(ctx, gap/2+rand.N(gap))
		if ctx.Err() != nil {
			return nil
		}
		if err := fn(); err != nil {
			return err
		}
	}
}

// injectCut cuts the Locker history.target chooses (the key's holder, the
// election's leader or a shared holder in turn; with none, a random
// contender) off for half a unit to two units at a time.
func (s *suite) injectCut(ctx context.Context, t *testing.T, h *history) error {
	return every(ctx, 2*s.unit, func() error {
		g, l := h.target()
		heal, err := s.h.Cut(l.Driver())
		if err != nil {
			return err
		}
		h.fault(g)
		pause(ctx, s.unit/2+rand.N(3*s.unit/2))
		heal()
		return nil
	})
}

// injectReset resets the connections of the Locker history.target
// chooses, as injectCut does.
func (s *suite) injectReset(ctx context.Context, t *testing.T, h *history) error {
	return every(ctx, s.unit, func() error {
		g, l := h.target()
		if err := s.h.Reset(l.Driver()); err != nil {
			return err
		}
		h.fault(g)
		return nil
	})
}

// injectRestart restarts the server every few units.
func (s *suite) injectRestart(ctx context.Context, h *history, restart func(context.Context) error, empty bool) error {
	return every(ctx, 3*s.unit, func() error {
		g, _ := h.holder()
		h.fault(g)
		if empty {
			h.mu.Lock()
			h.empties = append(h.empties, time.Now())
			h.mu.Unlock()
		}
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := restart(rctx); err != nil {
			return fmt.Errorf("restart: %w", err)
		}
		return nil
	})
}

// faultReport is one cell of the failure-mode matrix.
type faultReport struct {
	violations      []string
	margins         []time.Duration // next grant − loss, per loss-ended grant
	takeovers       []time.Duration // next grant − fault, per fault on a holder
	stale, accepted int             // fenced writes rejected, accepted
}

// checkHistory checks the history of one fault subtest and logs its
// matrix line. See the package documentation, "Fault subtests", for what
// it proves.
func (s *suite) checkHistory(t *testing.T, fault string, h *history) {
	// Every contender has stopped: the key must be free, at the latest once
	// the TTL of a release that could not reach the server has run out.
	probe := s.locker(t)
	pctx, cancel := context.WithTimeout(context.Background(), 2*s.long()+quick)
	lk, err := probe.Acquire(pctx, h.key, locker.WithTTL(s.unit))
	cancel()
	stopped := time.Now()
	var rep faultReport
	if err != nil {
		rep.violations = append(rep.violations, fmt.Sprintf("the key is still held after every contender stopped and its TTL passed: %v", err))
	} else {
		_ = lk.Release(s.callCtx(t))
	}

	h.mu.Lock()
	defer h.mu.Unlock()
	gs := slices.Clone(h.grants)
	slices.SortFunc(gs, func(a, b *hgrant) int { return a.end.Compare(b.end) })
	bound := s.h.LostBound[fault]

	for i, a := range gs {
		aEnd := a.beliefEnd(stopped)
		for _, b := range gs[i+1:] {
			// Tokens: a grant that certainly came first has the lower token.
			if a.end.Before(b.start) && a.token >= b.token && !s.emptyBetween(h, a.end, b.start) {
				rep.violations = append(rep.violations, fmt.Sprintf("token %d granted to %s after token %d granted to %s", b.token, b.who, a.token, a.who))
			}
			// Overlap: both had been granted by max(end), and both still
			// believed they held until min(beliefEnd).
			if a.who == b.who {
				continue
			}
			both := aEnd
			if bEnd := b.beliefEnd(stopped); bEnd.Before(both) {
				both = bEnd
			}
			over := both.Sub(b.end)
			if over > bound {
				rep.violations = append(rep.violations, fmt.Sprintf("%s (token %d) still believed it held %v after %s was granted token %d (bound %v; %s)",
					a.who, a.token, over.Round(time.Microsecond), b.who, b.token, bound, lostHow(a)))
			}
		}
		if i+1 < len(gs) && a.released.IsZero() {
			b := gs[i+1]
			m := b.end.Sub(aEnd)
			rep.margins = append(rep.margins, m)
			if m < 0 {
				t.Logf("%s (token %d, %s) ended %v after %s was granted token %d (within the bound)", a.who, a.token, lostHow(a), -m, b.who, b.token)
			}
		}
	}
	for _, f := range h.faults {
		if f.target == nil {
			continue
		}
		for _, g := range gs {
			if g != f.target && g.end.After(f.at) {
				rep.takeovers = append(rep.takeovers, g.end.Sub(f.at))
				break
			}
		}
	}
	// The fenced register: writes in the order they were made; a write with
	// a lower token than one already accepted is rejected.
	var ws []hwrite
	for _, g := range gs {
		ws = append(ws, g.writes...)
	}
	slices.SortFunc(ws, func(a, b hwrite) int { return a.at.Compare(b.at) })
	var high uint64
	for _, w := range ws {
		if w.token < high {
			rep.stale++
			continue
		}
		high = w.token
		rep.accepted++
	}
	for _, v := range rep.violations {
		t.Errorf("violation: %s", v)
	}
	if len(gs) == 0 {
		t.Errorf("no contender was ever granted the key in %d attempts", h.ops)
	}
	t.Logf("fault-matrix: test=%s %s", t.Name(), rep.line(fault, len(h.faults), h.ops, h.resumeLs))
}

// emptyBetween reports whether a data-losing restart began between from
// and to, for a driver whose tokens are not durable across one.
func (s *suite) emptyBetween(h *history, from, to time.Time) bool {
	if s.caps.DurableTokens {
		return false
	}
	for _, e := range h.empties {
		if e.After(from.Add(-time.Second)) && e.Before(to) {
			return true
		}
	}
	return false
}

func lostHow(g *hgrant) string {
	switch {
	case !g.lost.IsZero():
		return "Lost closed: " + g.cause
	case !g.released.IsZero():
		return "it called Release"
	case !g.deadline.IsZero():
		return "its safe deadline passed"
	}
	return "Lost never closed"
}

// line formats the report as one row of the failure-mode matrix; see
// scripts/faults.
func (r faultReport) line(fault string, faults, ops int, resumes []time.Duration) string {
	q := func(ds []time.Duration, p float64) string {
		if len(ds) == 0 {
			return "-"
		}
		ds = slices.Clone(ds)
		slices.Sort(ds)
		return matrixDur(ds[min(len(ds)-1, int(p*float64(len(ds))))])
	}
	extra := ""
	if len(resumes) > 0 {
		extra = fmt.Sprintf(" resume_to_lost_max=%s", q(resumes, 1))
	}
	return fmt.Sprintf("fault=%s violations=%d margin_min=%s margin_p50=%s takeover_p50=%s takeover_p99=%s faults=%d ops=%d stale_rejected=%d writes=%d%s",
		fault, len(r.violations), q(r.margins, 0), q(r.margins, 0.5), q(r.takeovers, 0.5), q(r.takeovers, 0.99), faults, ops, r.stale, r.accepted, extra)
}

// matrixDur rounds d for the matrix: to 10ms from a second, to 100µs from
// a millisecond.
func matrixDur(d time.Duration) string {
	switch {
	case d.Abs() >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d.Abs() >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}
