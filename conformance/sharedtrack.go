package conformance

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// trackLimit is the n of the shared track's semaphore: below the number of
// contenders, so that permits are contended for.
const trackLimit = 2

// strack is the shared-hold track of one fault subtest (trace row F17):
// while the contenders take turns on the key, every one of their Lockers
// also takes permits of a semaphore of trackLimit, and the read or (one
// time in two) the write side of a read-write lock, under the same
// faults. Each holder keeps its hold for up to 1.5 units; a writer, while
// it believes it holds, writes its token to a fenced register every
// unit/10, stamping the time before checking Lost.
type strack struct {
	on            bool // the driver is a SharedLocker
	semKey, rwKey string

	mu     sync.Mutex
	grants []*sgrant
}

// sgrant is one shared grant, as its holder saw it.
type sgrant struct {
	hgrant
	mode driver.SharedMode
	l    *locker.Locker
}

// startShared starts the shared track of h: one permit contender and one
// read-write contender per Locker, until ctx ends.
func (s *suite) startShared(ctx context.Context, wg *sync.WaitGroup, h *history) {
	h.sh = &strack{on: s.has["SharedLocker"], semKey: h.key + "/sem", rwKey: h.key + "/rw"}
	if !h.sh.on {
		return
	}
	for i, l := range h.lockers {
		wg.Go(func() { s.sharedContend(ctx, fmt.Sprintf("L%d/permit", i), l, h.sh, false) })
		wg.Go(func() { s.sharedContend(ctx, fmt.Sprintf("L%d/rw", i), l, h.sh, true) })
	}
}

// sharedContend takes a permit (or, rw, a read or write hold), holds it,
// releases it, and again, until ctx ends.
func (s *suite) sharedContend(ctx context.Context, who string, l *locker.Locker, tr *strack, rw bool) {
	sem, rwm := l.Semaphore(tr.semKey, trackLimit), l.RWMutex(tr.rwKey)
	for ctx.Err() == nil {
		mode, acquire := driver.SharedPermit, sem.Acquire
		if rw {
			mode, acquire = driver.SharedRead, rwm.AcquireRead
			if rand.N(2) == 0 {
				mode, acquire = driver.SharedWrite, rwm.AcquireWrite
			}
		}
		actx, cancel := context.WithTimeout(ctx, 4*s.unit)
		start := time.Now()
		lk, err := acquire(actx, locker.WithTTL(s.unit))
		end := time.Now()
		cancel()
		if err != nil {
			pause(ctx, s.unit/10) // a backend that is down fails at once
			continue
		}
		g := &sgrant{hgrant: hgrant{who: who, token: lk.Token(), start: start, end: end}, mode: mode, l: l}
		tr.mu.Lock()
		tr.grants = append(tr.grants, g)
		tr.mu.Unlock()
		s.keep(ctx, lk, &g.hgrant, &tr.mu, g.mode == driver.SharedWrite)
	}
}

// holder returns a Locker whose shared hold is believed now, a writer's
// first, if any.
func (tr *strack) holder() *locker.Locker {
	if tr == nil || !tr.on {
		return nil
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var l *locker.Locker
	for _, g := range tr.grants {
		if g.l == nil || !g.lost.IsZero() || !g.released.IsZero() {
			continue // released, lost, or the paused child's
		}
		if g.mode == driver.SharedWrite {
			return g.l
		}
		l = g.l
	}
	return l
}

// childWrite is the write hold of the shared track's read-write lock that
// the child of Faults/Pause takes beside the key; nil where the driver
// offers no shared holds.
type childWrite struct {
	lk     *locker.Lock
	lostAt chan time.Time
	report func(format string, args ...any)
}

// childShared takes the write hold in the child of Faults/Pause, and
// reports its grant as "sgranted token start end deadline".
func childShared(ctx context.Context, t *testing.T, l *locker.Locker, key string, ttl time.Duration, report func(string, ...any)) *childWrite {
	start := time.Now()
	lk, err := l.RWMutex(key+"/rw").AcquireWrite(ctx, locker.WithTTL(ttl))
	if errors.Is(err, errors.ErrUnsupported) {
		return nil
	}
	if err != nil {
		report("error %q", err.Error())
		t.Fatalf("conformance: child: AcquireWrite: %v", err)
	}
	report("sgranted %d %d %d %d", lk.Token(), start.UnixNano(), time.Now().UnixNano(), lk.Deadline().UnixNano())
	w := &childWrite{lk: lk, lostAt: make(chan time.Time, 1), report: report}
	go func() {
		<-lk.Lost()
		w.lostAt <- time.Now()
	}()
	return w
}

// write reports "swrite token at deadline" while the hold's Lost is open.
func (w *childWrite) write() {
	if w == nil {
		return
	}
	at, deadline := time.Now(), w.lk.Deadline()
	select {
	case <-w.lk.Lost():
		return
	default:
	}
	w.report("swrite %d %d %d", w.lk.Token(), at.UnixNano(), deadline.UnixNano())
}

// end waits (up to 5s) for the hold's Lost, reports "slost at cause", and
// releases it.
func (w *childWrite) end() {
	if w == nil {
		return
	}
	select {
	case when := <-w.lostAt:
		w.report("slost %d %q", when.UnixNano(), fmt.Sprint(w.lk.Err()))
	case <-time.After(5 * time.Second):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = w.lk.Release(ctx)
}

// recordChild records a line of the child of Faults/Pause about its write
// hold g ("swrite" or "slost").
func (tr *strack) recordChild(g *sgrant, f []string, ns func(string) time.Time) {
	if tr == nil || !tr.on || g == nil {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	g.childLine(f, ns)
}
