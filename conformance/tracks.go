package conformance

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// etrack is the election track of one fault subtest: while the contenders
// take turns on the key, every one of their Lockers also Leads one
// election, under the same faults (trace row F6). Each leader, while fn's
// context is open, stamps the time every unit/20 (a stamp is taken before
// the check, so a slow machine can only hide a belief, never invent one),
// and resigns after up to 1.5 units.
type etrack struct {
	name string
	on   bool // the election is run (the driver is an Inspector)

	mu    sync.Mutex
	terms []*eterm
	n     int // faults aimed so far, to alternate their targets
}

// eterm is one term, as its leader saw it.
type eterm struct {
	who   string
	l     *locker.Locker
	term  uint64
	after time.Time // the campaign that won it began after this
	entry time.Time // fn started
	last  time.Time // the last stamp taken while fn's context was open
	done  bool      // fn returned
}

// startElections starts the election track of h: one Lead per Locker, until
// ctx ends.
func (s *suite) startElections(ctx context.Context, wg *sync.WaitGroup, h *history) {
	h.el = &etrack{name: h.key, on: s.has["Inspector"]}
	if !h.el.on {
		return
	}
	for i, l := range h.lockers {
		wg.Go(func() { s.lead(ctx, fmt.Sprintf("L%d", i), l, h.el) })
	}
}

// lead Leads the track's election through l until ctx ends.
func (s *suite) lead(ctx context.Context, who string, l *locker.Locker, tr *etrack) {
	after := time.Now()
	e := l.Election(tr.name)
	for ctx.Err() == nil {
		_ = e.Lead(ctx, who, func(fctx context.Context, term uint64) error {
			g := &eterm{who: who, l: l, term: term, after: after, entry: time.Now()}
			tr.mu.Lock()
			tr.terms = append(tr.terms, g)
			tr.mu.Unlock()
			until := time.Now().Add(rand.N(3 * s.unit / 2))
			tick := time.NewTicker(max(s.unit/20, time.Millisecond))
			defer tick.Stop()
			for time.Now().Before(until) {
				at := time.Now()
				if fctx.Err() != nil {
					break
				}
				tr.mu.Lock()
				g.last = at
				tr.mu.Unlock()
				select {
				case <-tick.C:
				case <-fctx.Done():
				}
			}
			tr.mu.Lock()
			g.done = true
			tr.mu.Unlock()
			after = time.Now()
			return nil
		}, locker.WithTTL(s.unit))
		// Lead returns when ctx ends, or on an error no retry can cure.
		pause(ctx, s.unit/10)
	}
}

// leader returns the Locker whose fn runs now, if any.
func (tr *etrack) leader() *locker.Locker {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, g := range slices.Backward(tr.terms) {
		if !g.done {
			return g.l
		}
	}
	return nil
}

// target returns the Locker a Cut or a Reset aims at: in turn the holder
// of the key (with its grant), the election's leader, and a holder of a
// shared hold of the shared track (a writer first), each where there is
// one; else the holder of the key, else a random contender.
func (h *history) target() (*hgrant, *locker.Locker) {
	g, l := h.holder()
	tr := h.el
	tr.mu.Lock()
	tr.n++
	turn := tr.n % 3
	tr.mu.Unlock()
	var other *locker.Locker
	switch {
	case turn == 1 && tr.on:
		other = tr.leader()
	case turn == 2 || turn == 1 && !tr.on:
		other = h.sh.holder()
	}
	if other != nil && other != l {
		g, l = nil, other
	}
	if l == nil {
		l = h.lockers[rand.N(len(h.lockers))]
	}
	return g, l
}

// checkElections checks the election track of one fault subtest: never two
// leaders believing they lead at once for longer than the Harness's
// LostBound for the fault, and terms in real-time order (a term won by a
// campaign that began after another term's fn had started is higher),
// except across RestartEmpty for a driver whose tokens are not durable.
func (s *suite) checkElections(t *testing.T, fault string, h *history) {
	tr := h.el
	if tr == nil || !tr.on {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	gs := slices.Clone(tr.terms)
	slices.SortFunc(gs, func(a, b *eterm) int { return a.entry.Compare(b.entry) })
	bound := s.h.LostBound[fault]
	var violations []string
	for i, a := range gs {
		for _, b := range gs[i+1:] {
			if a.entry.Before(b.after) && a.term >= b.term && !s.emptyBetween(h, a.entry, b.after) {
				violations = append(violations, fmt.Sprintf("%s won term %d in a campaign that began after %s led in term %d", b.who, b.term, a.who, a.term))
			}
			if a.who == b.who || a.last.IsZero() || b.last.IsZero() {
				continue
			}
			both := a.last
			if b.last.Before(both) {
				both = b.last
			}
			if over := both.Sub(b.entry); over > bound {
				violations = append(violations, fmt.Sprintf("%s (term %d) still believed it led %v after %s led in term %d (bound %v)",
					a.who, a.term, over.Round(time.Microsecond), b.who, b.term, bound))
			}
		}
	}
	for _, v := range violations {
		t.Errorf("election violation: %s", v)
	}
	t.Logf("election-track: fault=%s terms=%d violations=%d", fault, len(gs), len(violations))
}

// keep holds lk, g's grant, for up to 1.5 units, or until its Lost closes
// or ctx ends; while it believes it holds, and write is set, it writes g's
// token to the fenced register (g.writes) every unit/10, stamping the time
// before checking Lost (a stamp taken while Lost was open was made while
// the holder believed it held). It then releases lk, and records in g,
// under mu, how the belief ended.
func (s *suite) keep(ctx context.Context, lk *locker.Lock, g *hgrant, mu *sync.Mutex, write bool) {
	lostAt := make(chan time.Time, 1)
	go func() {
		<-lk.Lost()
		lostAt <- time.Now()
	}()
	until := time.Now().Add(rand.N(3 * s.unit / 2))
	tick := time.NewTicker(max(s.unit/10, time.Millisecond))
	for lost := false; !lost && time.Now().Before(until) && ctx.Err() == nil; {
		at := time.Now()
		select {
		case <-lk.Lost():
			lost = true
			continue
		default:
		}
		if write {
			mu.Lock()
			g.writes = append(g.writes, hwrite{token: g.token, at: at})
			mu.Unlock()
		}
		select {
		case <-tick.C:
		case <-lk.Lost():
			lost = true
		case <-ctx.Done():
		}
	}
	tick.Stop()
	mu.Lock()
	select {
	case <-lk.Lost():
	default:
		g.released = time.Now()
	}
	mu.Unlock()
	var lostWhen time.Time
	if g.released.IsZero() {
		lostWhen = <-lostAt
	}
	rctx, cancel := context.WithTimeout(context.Background(), 2*s.unit+quick)
	_ = lk.Release(rctx)
	cancel()
	mu.Lock()
	// Once the lock has ended, Deadline keeps the value it had then: Lost
	// closes at it when no renewal succeeded, whenever the goroutine that
	// notes the moment runs.
	g.deadline = lk.Deadline()
	if !lostWhen.IsZero() {
		g.lost = lostWhen
		g.cause = fmt.Sprint(lk.Err())
	}
	mu.Unlock()
}
