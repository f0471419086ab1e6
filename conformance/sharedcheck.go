package conformance

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// checkShared checks the shared track of one fault subtest (row F17): never
// more than trackLimit permit holders, nor a writer beside another holder
// of the read-write lock, all believing they hold at once for longer than
// the Harness's LostBound for the fault; tokens of each lock in real-time
// order (except across RestartEmpty for a driver whose tokens are not
// durable); the fenced register never accepting a write made after a
// later grant had written; and both locks free once every contender has
// stopped and the last TTL has run out.
func (s *suite) checkShared(t *testing.T, fault string, h *history) {
	tr := h.sh
	if tr == nil || !tr.on {
		return
	}
	violations := s.probeShared(t, tr)
	stopped := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	var permits, rw []*sgrant
	for _, g := range tr.grants {
		if g.mode == driver.SharedPermit {
			permits = append(permits, g)
		} else {
			rw = append(rw, g)
		}
	}
	bound := s.h.LostBound[fault]
	violations = append(violations, s.trackTokens(h, "permit", permits)...)
	violations = append(violations, s.trackTokens(h, "read-write", rw)...)
	violations = append(violations, permitOverlaps(permits, stopped, bound)...)
	violations = append(violations, writerOverlaps(rw, stopped, bound)...)
	stale, accepted, vs := s.fencedWrites(h, rw)
	violations = append(violations, vs...)
	for _, v := range violations {
		t.Errorf("shared violation: %s", v)
	}
	writes := 0
	for _, g := range rw {
		if g.mode == driver.SharedWrite {
			writes++
		}
	}
	t.Logf("shared-track: fault=%s permits=%d reads=%d writes=%d violations=%d stale_rejected=%d register_writes=%d",
		fault, len(permits), len(rw)-writes, writes, len(violations), stale, accepted)
	if len(tr.grants) == 0 {
		t.Errorf("shared track: no permit or read-write hold was ever granted")
	}
}

// probeShared checks that the track's locks are free once every contender
// has stopped: a write hold and trackLimit permits are granted within the
// time a release that could not reach the server takes to expire.
func (s *suite) probeShared(t *testing.T, tr *strack) []string {
	probe := s.locker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.long()+quick)
	defer cancel()
	var vs []string
	var held []*locker.Lock
	lk, err := probe.RWMutex(tr.rwKey).AcquireWrite(ctx, locker.WithTTL(s.unit))
	if err != nil {
		vs = append(vs, fmt.Sprintf("the read-write lock is still held after every contender stopped and its TTL passed: %v", err))
	} else {
		held = append(held, lk)
	}
	for i := range trackLimit {
		lk, err := probe.Semaphore(tr.semKey, trackLimit).Acquire(ctx, locker.WithTTL(s.unit))
		if err != nil {
			vs = append(vs, fmt.Sprintf("permit %d of %d is still held after every contender stopped and its TTL passed: %v", i+1, trackLimit, err))
			break
		}
		held = append(held, lk)
	}
	for _, lk := range held {
		_ = lk.Release(s.callCtx(t))
	}
	return vs
}

// trackTokens checks that a grant whose Acquire returned before another's
// began has the lower token.
func (s *suite) trackTokens(h *history, what string, gs []*sgrant) []string {
	var vs []string
	for _, a := range gs {
		for _, b := range gs {
			if a.end.Before(b.start) && a.token >= b.token && !s.emptyBetween(h, a.end, b.start) {
				vs = append(vs, fmt.Sprintf("%s token %d granted to %s after token %d granted to %s", what, b.token, b.who, a.token, a.who))
			}
		}
	}
	return vs
}

// permitOverlaps finds trackLimit+1 permit holders that all believed they
// held at once, for longer than bound after the last of them was granted:
// for each grant b, the others granted by b's return whose belief outlasted
// it by bound.
func permitOverlaps(gs []*sgrant, stopped time.Time, bound time.Duration) []string {
	var vs []string
	for _, b := range gs {
		from := b.end.Add(bound)
		if !b.beliefEnd(stopped).After(from) {
			continue
		}
		var with []string
		for _, a := range gs {
			if a != b && a.who != b.who && !a.end.After(b.end) && a.beliefEnd(stopped).After(from) {
				with = append(with, fmt.Sprintf("%s (token %d; %s)", a.who, a.token, lostHow(&a.hgrant)))
			}
		}
		if len(with) >= trackLimit {
			vs = append(vs, fmt.Sprintf("%d permit holders of a semaphore of %d believed they held more than %v after %s was granted token %d: %v",
				len(with)+1, trackLimit, bound, b.who, b.token, with))
		}
	}
	return vs
}

// writerOverlaps finds a write hold and another hold of the read-write
// lock that both believed they held for longer than bound after the later
// of the two was granted.
func writerOverlaps(gs []*sgrant, stopped time.Time, bound time.Duration) []string {
	var vs []string
	for i, x := range gs {
		for _, y := range gs[i+1:] {
			if x.who == y.who || x.mode != driver.SharedWrite && y.mode != driver.SharedWrite {
				continue
			}
			a, b := x, y // b was granted last
			if b.end.Before(a.end) {
				a, b = y, x
			}
			both := a.beliefEnd(stopped)
			if e := b.beliefEnd(stopped); e.Before(both) {
				both = e
			}
			if over := both.Sub(b.end); over > bound {
				vs = append(vs, fmt.Sprintf("%s (%v, token %d) still believed it held %v after %s was granted %v with token %d (bound %v; %s)",
					a.who, a.mode, a.token, over.Round(time.Microsecond), b.who, b.mode, b.token, bound, lostHow(&a.hgrant)))
			}
		}
	}
	return vs
}

// fencedWrites replays the writers' register writes in the order they were
// made; the register rejects a token lower than one it accepted. A write
// made after a grant that began after the writer's own grant had returned
// has written is stale, and must be rejected (except across RestartEmpty
// for a driver whose tokens are not durable).
func (s *suite) fencedWrites(h *history, gs []*sgrant) (stale, accepted int, vs []string) {
	type w struct {
		hwrite
		g *sgrant
	}
	var ws []w
	for _, g := range gs {
		for _, x := range g.writes {
			ws = append(ws, w{x, g})
		}
	}
	slices.SortFunc(ws, func(a, b w) int { return a.at.Compare(b.at) })
	var high uint64
	for i, x := range ws {
		if x.token < high {
			stale++
			continue
		}
		high = x.token
		accepted++
		for _, y := range ws[:i] {
			if y.g != x.g && y.g.start.After(x.g.end) && !s.emptyBetween(h, x.g.end, y.g.start) {
				vs = append(vs, fmt.Sprintf("the register accepted %s's write of token %d after %s, granted later, wrote token %d",
					x.g.who, x.token, y.g.who, y.token))
				break
			}
		}
	}
	return stale, accepted, vs
}
