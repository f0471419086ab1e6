package locker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// deafWaiter is a mem Locker (with its Inspector) whose Waiter never wakes
// anyone, as a fair queue that wakes only the waiters queued for a key
// never wakes an observer.
type deafWaiter struct{ *faulty }

func (d deafWaiter) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	d.subscribes.Add(1)
	return make(chan struct{}), func() {}, nil
}

// TestElectionObservePollsWhateverItsWaiter: Observe reads the holder at
// least every 100ms whatever notifications it has, so it sees a resign,
// and a new leader, that its Waiter never tells it of (the Redis fair
// queue on Adopted and Redlock Lockers wakes only queued waiters). On the
// old code a Waiter made it wait up to 2s (or the leader's remaining TTL).
func TestElectionObservePollsWhateverItsWaiter(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s := mem.NewStore()
	od := deafWaiter{newFaulty(s)}
	obs, cand := locker.New(od), locker.New(s.Locker())
	defer obs.Close()
	defer cand.Close()
	e := cand.Election("e")
	lk, err := e.Campaign(ctx, "a", locker.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ch, stop := startObserve(ctx, t, obs.Election("e"))
	defer stop()
	next := func(what string, since time.Time) locker.Leader {
		t.Helper()
		// 100ms of polling, and slack for -race on a loaded machine.
		return nextWithin(t, ch, what, since, 600*time.Millisecond, "within 100ms of polling")
	}
	if ld := next("the leader", time.Now()); ld.Value != "a" || ld.Term != lk.Token() {
		t.Fatalf("first report %+v, want a at term %d", ld, lk.Token())
	}
	for i, v := range []string{"b", "c", "d"} {
		// Wait until the observer is idle on the leader (past its
		// re-reads after the grant), then resign.
		time.Sleep(300 * time.Millisecond)
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if ld := next("the resign", time.Now()); ld != (locker.Leader{}) {
			t.Fatalf("round %d: after the resign %+v, want nobody", i, ld)
		}
		if lk, err = e.Campaign(ctx, v, locker.WithTTL(30*time.Second)); err != nil {
			t.Fatal(err)
		}
		if ld := next("the new leader", time.Now()); ld.Value != v || ld.Term != lk.Token() {
			t.Fatalf("round %d: %+v, want %s at term %d", i, ld, v, lk.Token())
		}
	}
	if od.subscribes.Load() == 0 {
		t.Fatal("the observer never subscribed: the test does not cover a Waiter")
	}
	_ = lk.Release(ctx)
}

// observed is one report of an observer, and when it came.
type observed struct {
	ld locker.Leader
	at time.Time
}

// nextWithin returns the observer's next report, failing if it does not
// come within 5s, and reporting an error (want says what was expected) if
// it came later than bound after since.
func nextWithin(t *testing.T, ch <-chan observed, what string, since time.Time, bound time.Duration, want string) locker.Leader {
	t.Helper()
	select {
	case s := <-ch:
		if d := s.at.Sub(since); d > bound {
			t.Errorf("observed %s %v after it happened; want %s", what, d, want)
		}
		return s.ld
	case <-time.After(5 * time.Second):
		t.Fatalf("observer did not report %s", what)
	}
	return locker.Leader{}
}

// startObserve runs e.Observe until stop is called, sending each report on
// the returned channel; stop returns once the loop has ended.
func startObserve(ctx context.Context, t *testing.T, e *locker.Election) (<-chan observed, func()) {
	ch := make(chan observed, 16)
	octx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for ld, err := range e.Observe(octx) {
			if err != nil {
				t.Errorf("observe: %v", err)
				continue
			}
			select {
			case ch <- observed{ld, time.Now()}:
			case <-octx.Done():
				return
			}
		}
	})
	return ch, func() { cancel(); wg.Wait() }
}

// lateReply delays the reply of its first granted Acquire past the TTL,
// as a cut-off network holding a reply back.
type lateReply struct {
	*faulty
	delay time.Duration
	once  atomic.Bool
	first atomic.Uint64
}

func (l *lateReply) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	tok, err := l.faulty.Acquire(ctx, key, owner, ttl)
	if err == nil && l.once.CompareAndSwap(false, true) {
		l.first.Store(tok)
		time.Sleep(l.delay)
	}
	return tok, err
}

// TestElectionLeadSkipsLateGrant: Lead does not run fn for a grant whose
// reply came back after its safe deadline (another candidate may lead by
// then); it campaigns again and runs fn for the next term. On the old code
// fn ran with the late grant's term and an open context.
func TestElectionLeadSkipsLateGrant(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	const ttl = 100 * time.Millisecond
	d := &lateReply{faulty: newFaulty(mem.NewStore()), delay: ttl + 20*time.Millisecond}
	l := locker.New(d)
	defer l.Close()
	errDone := errors.New("done")
	var terms []uint64
	err := l.Election("e").Lead(ctx, "v", func(fctx context.Context, term uint64) error {
		terms = append(terms, term)
		return errDone
	}, locker.WithTTL(ttl))
	if !errors.Is(err, errDone) {
		t.Fatalf("Lead: %v", err)
	}
	if len(terms) != 1 || terms[0] == d.first.Load() || d.first.Load() == 0 {
		t.Fatalf("fn ran for terms %v; the late grant's term was %d", terms, d.first.Load())
	}
}

// countingInspects is a mem Locker, with its ChangeWatcher, that counts
// the reads of the holder.
type countingInspects struct {
	*mem.Locker
	inspects atomic.Int64
}

func (c *countingInspects) Inspect(ctx context.Context, key string) (driver.Info, error) {
	c.inspects.Add(1)
	return c.Locker.Inspect(ctx, key)
}

// TestElectionObserveUsesChangeWatcher: with a driver.ChangeWatcher,
// Observe learns of each grant and release from the driver instead of
// reading the holder every 100ms: it reads at most twice during a 500ms
// vacancy, and yet reports each new leader and each resign at once (well
// before its 2s safety read). On the old code it read about every 100ms
// (5 or more reads in the vacancy).
func TestElectionObserveUsesChangeWatcher(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s := mem.NewStore()
	od := &countingInspects{Locker: s.Locker().(*mem.Locker)}
	obs, cand := locker.New(od), locker.New(s.Locker())
	defer obs.Close()
	defer cand.Close()
	ch, stop := startObserve(ctx, t, obs.Election("e"))
	defer stop()
	next := func(what string, since time.Time) locker.Leader {
		t.Helper()
		// Notified at once; a read at the 2s safety net would be late.
		return nextWithin(t, ch, what, since, time.Second, "notified at once")
	}
	if ld := next("nobody", time.Now()); ld != (locker.Leader{}) {
		t.Fatalf("first report %+v, want nobody", ld)
	}
	e := cand.Election("e")
	for i, v := range []string{"a", "b", "c"} {
		before := od.inspects.Load()
		time.Sleep(500 * time.Millisecond) // a vacancy: the observer idles
		if n := od.inspects.Load() - before; n > 2 {
			t.Errorf("round %d: %d reads of the holder in a 500ms vacancy, want at most 2 (no 100ms polling)", i, n)
		}
		lk, err := e.Campaign(ctx, v, locker.WithTTL(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ld := next("the new leader", time.Now()); ld.Value != v || ld.Term != lk.Token() {
			t.Fatalf("round %d: %+v, want %s at term %d", i, ld, v, lk.Token())
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if ld := next("the resign", time.Now()); ld != (locker.Leader{}) {
			t.Fatalf("round %d: after the resign %+v, want nobody", i, ld)
		}
	}
}
