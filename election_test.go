package locker_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// counting counts every call that reaches the backend, and hides the
// optional interfaces of the driver it wraps (no Inspector).
type counting struct {
	inner driver.Locker
	calls atomic.Int64
}

func (c *counting) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	c.calls.Add(1)
	return c.inner.Acquire(ctx, key, owner, ttl)
}

func (c *counting) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	c.calls.Add(1)
	return c.inner.Refresh(ctx, key, owner, ttl)
}

func (c *counting) Release(ctx context.Context, key, owner string) error {
	c.calls.Add(1)
	return c.inner.Release(ctx, key, owner)
}

func (c *counting) Close() error { return c.inner.Close() }

// inspecting is counting with an Inspector.
type inspecting struct{ *counting }

func (c inspecting) Inspect(ctx context.Context, key string) (driver.Info, error) {
	c.calls.Add(1)
	return c.inner.(driver.Inspector).Inspect(ctx, key)
}

// TestElectionBadInput: bad input gets one clear error before any I/O, and
// Lead with a nil fn panics.
func TestElectionBadInput(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	c := &counting{inner: mem.NewStore().Locker()}
	l := locker.New(inspecting{c})
	defer l.Close()
	fn := func(context.Context, uint64) error { return nil }
	empty := l.Election("")
	checks := map[string]error{
		"campaign empty name": second(empty.Campaign(ctx, "v")),
		"lead empty name":     empty.Lead(ctx, "v", fn),
		"leader empty name":   second(empty.Leader(ctx)),
		"long name":           second(l.Election(strings.Repeat("n", 5000)).Leader(ctx)),
		"long value":          second(l.Election("e").Campaign(ctx, strings.Repeat("v", locker.MaxElectionValue+1))),
		"WithOwner":           second(l.Election("e").Campaign(ctx, "v", locker.WithOwner("me"))),
		"zero ttl":            l.Election("e").Lead(ctx, "v", fn, locker.WithTTL(0)),
	}
	for _, err := range empty.Observe(ctx) {
		checks["observe empty name"] = err
	}
	for name, err := range checks {
		if !errors.Is(err, locker.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if n := c.calls.Load(); n != 0 {
		t.Errorf("%d backend calls for bad input", n)
	}
	// A value at the limit is accepted.
	lk, err := l.Election("e").Campaign(ctx, strings.Repeat("v", locker.MaxElectionValue))
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Release(ctx)

	defer func() {
		if recover() == nil {
			t.Error("Lead with a nil fn did not panic")
		}
	}()
	_ = l.Election("e").Lead(ctx, "v", nil)
}

// TestElectionUnsupported: a driver without an Inspector cannot hold
// elections: an error matching errors.ErrUnsupported, naming the driver,
// before any I/O.
func TestElectionUnsupported(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	c := &counting{inner: mem.NewStore().Locker()}
	l := locker.New(c)
	defer l.Close()
	e := l.Election("e")
	errs := []error{
		second(e.Campaign(ctx, "v")),
		e.Lead(ctx, "v", func(context.Context, uint64) error { return nil }),
		second(e.Leader(ctx)),
	}
	for _, err := range e.Observe(ctx) {
		errs = append(errs, err)
	}
	for i, err := range errs {
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "counting") {
			t.Errorf("call %d: %v, want errors.ErrUnsupported naming the driver", i, err)
		}
	}
	if n := c.calls.Load(); n != 0 {
		t.Errorf("%d backend calls", n)
	}
}

// TestElectionCampaign: one leader at a time; the term is the token and
// increases; Leader shows the value, whatever bytes it holds; Release
// resigns and the next candidate is elected at once.
func TestElectionCampaign(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	s := mem.NewStore()
	a, b := locker.New(s.Locker()), locker.New(s.Locker())
	defer a.Close()
	defer b.Close()
	if _, err := a.Election("e").Leader(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Leader with nobody leading: %v, want ErrNotHeld", err)
	}
	valA := "10.0.0.7:8080/\x00:q:" // separators and a NUL are just bytes
	la, err := a.Election("e").Campaign(ctx, valA, locker.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ld, err := b.Election("e").Leader(ctx)
	if err != nil || ld.Value != valA || ld.Term != la.Token() || ld.Remaining <= 0 || ld.Remaining > time.Second {
		t.Fatalf("Leader = %+v, %v; want %q term %d", ld, err, valA, la.Token())
	}
	won := make(chan *locker.Lock, 1)
	go func() {
		lb, err := b.Election("e").Campaign(ctx, "", locker.WithTTL(time.Second))
		if err != nil {
			t.Error(err)
		}
		won <- lb
	}()
	select {
	case <-won:
		t.Fatal("b was elected while a leads")
	case <-time.After(50 * time.Millisecond):
	}
	start := time.Now()
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var lb *locker.Lock
	select {
	case lb = <-won:
	case <-time.After(time.Second):
		t.Fatal("b not elected within 1s of a's resign")
	}
	t.Logf("handoff after resign: %v", time.Since(start))
	if lb.Token() <= la.Token() {
		t.Fatalf("term %d after term %d", lb.Token(), la.Token())
	}
	ld, err = a.Election("e").Leader(ctx)
	if err != nil || ld.Value != "" || ld.Term != lb.Token() {
		t.Fatalf("Leader = %+v, %v; want empty value, term %d", ld, err, lb.Token())
	}
	_ = lb.Release(ctx)
}

// TestElectionNamespace: an election and a mutex of the same name are
// different locks; a mutex holding the election's key is not a leader.
func TestElectionNamespace(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	m, err := l.TryAcquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(ctx)
	e, err := l.Election("x").Campaign(ctx, "v")
	if err != nil {
		t.Fatalf("election x while mutex x is held: %v", err)
	}
	if e.Key() != locker.ElectionPrefix+"x" {
		t.Errorf("election key %q", e.Key())
	}
	_ = e.Release(ctx)
	foreign, err := l.TryAcquire(ctx, locker.ElectionPrefix+"y")
	if err != nil {
		t.Fatal(err)
	}
	defer foreign.Release(ctx)
	if ld, err := l.Election("y").Leader(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("Leader of a key held by a mutex: %+v, %v; want ErrNotHeld", ld, err)
	}
}

// TestElectionNoPhantomLeader: a leader whose renewals fail has fn's
// context cancelled, with the loss as its cause, before the next candidate
// is elected; Lead then campaigns again.
func TestElectionNoPhantomLeader(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s := mem.NewStore()
	f := newFaulty(s)
	a, b := locker.New(wideMargin{f}), locker.New(s.Locker())
	defer a.Close()
	defer b.Close()
	const ttl = time.Second
	var leadCtx atomic.Pointer[context.Context]
	var leadTerm atomic.Uint64
	elected := make(chan uint64, 4)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	leadDone := make(chan error, 1)
	go func() {
		leadDone <- a.Election("e").Lead(lctx, "a", func(fctx context.Context, term uint64) error {
			leadCtx.Store(&fctx)
			leadTerm.Store(term)
			elected <- term
			<-fctx.Done()
			if lctx.Err() == nil {
				if c := context.Cause(fctx); !errors.Is(c, locker.ErrNotHeld) {
					t.Errorf("fn's cause %v, want ErrNotHeld", c)
				}
			}
			return fctx.Err()
		}, locker.WithTTL(ttl))
	}()
	var t1 uint64
	select {
	case t1 = <-elected:
	case <-ctx.Done():
		t.Fatal("a not elected")
	}
	f.setFailRefresh(errTransient)
	lb, err := b.Election("e").Campaign(ctx, "b", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if (*leadCtx.Load()).Err() == nil {
		t.Fatalf("b was elected (term %d) while a's fn (term %d) still had a live context: a phantom leader", lb.Token(), leadTerm.Load())
	}
	if lb.Token() <= t1 {
		t.Fatalf("term %d after %d", lb.Token(), t1)
	}
	// a campaigns again and wins once b resigns.
	f.setFailRefresh(nil)
	_ = lb.Release(ctx)
	// (a may have won a term in between, while its renewals still failed.)
	for t3 := uint64(0); t3 <= lb.Token(); {
		select {
		case t3 = <-elected:
		case err := <-leadDone:
			t.Fatalf("Lead returned: %v", err)
		case <-ctx.Done():
			t.Fatal("a not elected again")
		}
	}
	stop()
	if err := <-leadDone; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lead after cancel: %v", err)
	}
	// The cancelled Lead resigned before returning.
	if _, err := b.Election("e").Leader(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Leader after Lead returned: %v, want ErrNotHeld", err)
	}
}

// wideMargin declares a drift margin of a fifth of the TTL, so that a
// loaded machine whose timers fire late cannot reorder the holder's
// deadline and the server's expiry: the test is about what the election
// does at the deadline.
type wideMargin struct{ *faulty }

func (wideMargin) Capabilities() driver.Capabilities { return driver.Capabilities{DriftFactor: 0.2} }

// TestElectionLeadReturns: fn returning nil resigns and campaigns again;
// fn returning an error resigns and ends Lead with it.
func TestElectionLeadReturns(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	e := l.Election("e")
	errStop := errors.New("stop")
	var terms []uint64
	err := e.Lead(ctx, "v", func(ctx context.Context, term uint64) error {
		if ld, err := e.Leader(ctx); err != nil || ld.Term != term || ld.Value != "v" {
			t.Errorf("Leader inside fn: %+v, %v", ld, err)
		}
		terms = append(terms, term)
		if len(terms) < 3 {
			return nil
		}
		return errStop
	})
	if !errors.Is(err, errStop) {
		t.Fatalf("Lead: %v, want fn's error", err)
	}
	if len(terms) != 3 || terms[0] >= terms[1] || terms[1] >= terms[2] {
		t.Fatalf("terms %v", terms)
	}
	if _, err := e.Leader(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Fatalf("Leader after Lead: %v, want ErrNotHeld", err)
	}
}

// TestElectionObserve: an observer sees nobody, then every leader in turn
// with its value and increasing terms, and nobody again, each soon after
// the change.
func TestElectionObserve(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s := mem.NewStore()
	obs, cand := locker.New(s.Locker()), locker.New(s.Locker())
	defer obs.Close()
	defer cand.Close()
	ch, stop := startObserve(ctx, t, obs.Election("e"))
	next := func(what string) observed {
		t.Helper()
		select {
		case s := <-ch:
			return s
		case <-time.After(5 * time.Second):
			t.Fatalf("observer did not report %s", what)
		}
		return observed{}
	}
	if s := next("the start"); s.ld != (locker.Leader{}) {
		t.Fatalf("first report %+v, want nobody", s.ld)
	}
	e := cand.Election("e")
	var last uint64
	for i, v := range []string{"a", "b", "c"} {
		lk, err := e.Campaign(ctx, v, locker.WithTTL(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		s := next(v)
		if s.ld.Value != v || s.ld.Term != lk.Token() || s.ld.Term <= last {
			t.Fatalf("report %d: %+v, want %q term %d", i, s.ld, v, lk.Token())
		}
		t.Logf("observed %q after %v", v, s.at.Sub(at))
		if d := s.at.Sub(at); d > 150*time.Millisecond {
			t.Errorf("observed %q %v after the grant", v, d)
		}
		last = s.ld.Term
		_ = lk.Release(ctx)
		at = time.Now()
		if s := next("the resign"); s.ld != (locker.Leader{}) {
			t.Fatalf("after resign %+v, want nobody", s.ld)
		} else if d := s.at.Sub(at); d > 150*time.Millisecond {
			t.Errorf("observed the resign %v after it", d)
		}
	}
	stop()
}

// TestElectionObserveStopsOnBreak: breaking out of the loop ends the
// observation and its subscriptions.
func TestElectionObserveStopsOnBreak(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	n := 0
	for _, err := range l.Election("e").Observe(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		n++
		break
	}
	if n != 1 {
		t.Fatalf("%d reports", n)
	}
}

// second returns the error of a two-value call.
func second[T any](_ T, err error) error { return err }

// TestElectionMetrics: the lock instruments carry locker.kind, election for
// an election's lock and mutex otherwise, and locker.election.terms counts
// the terms won.
func TestElectionMetrics(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	m := newMetrics(t)
	l := locker.New(mem.NewStore().Locker(), locker.WithMeterProvider(m.mp))
	defer l.Close()
	mu, err := l.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		lk, err := l.Election("x").Campaign(ctx, "v")
		if err != nil {
			t.Fatal(err)
		}
		_ = lk.Release(ctx)
	}
	_ = mu.Release(ctx)
	m.expect(t, 2, "locker.election.terms", "locker.kind=election", "locker.driver=custom")
	m.expect(t, 2, "locker.acquire.duration", "locker.kind=election", "locker.result=acquired")
	m.expect(t, 1, "locker.acquire.duration", "locker.kind=mutex", "locker.result=acquired")
	m.expect(t, 2, "locker.hold.duration", "locker.kind=election")
	m.expect(t, 1, "locker.hold.duration", "locker.kind=mutex")
	for _, p := range m.points(t) {
		if _, ok := p.attrs.Value("locker.kind"); !ok {
			t.Errorf("%s %v: no locker.kind", p.name, p.attrs.ToSlice())
		}
	}
	// Under WithKeyName too, the kind follows the key.
	m2 := newMetrics(t)
	l2 := locker.New(mem.NewStore().Locker(), locker.WithMeterProvider(m2.mp),
		locker.WithKeyName(func(string) string { return "all" }))
	defer l2.Close()
	lk, err := l2.Election("x").Campaign(ctx, "v")
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Release(ctx)
	mu, err = l2.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	_ = mu.Release(ctx)
	m2.expect(t, 1, "locker.election.terms", "locker.kind=election", "locker.key=all")
	m2.expect(t, 1, "locker.hold.duration", "locker.kind=election", "locker.key=all")
	m2.expect(t, 1, "locker.hold.duration", "locker.kind=mutex", "locker.key=all")
}

// flaky wraps a mem Locker (with its Inspector, without its Waiter) and
// injects faults into Acquire: with fail set, every call fails with
// errTransient without reaching the store; with hang set, a call makes the
// grant and then never answers, until its context ends, as when the reply
// is lost. It records when each failed call came.
type flaky struct {
	driver.Locker
	fail, hang atomic.Bool

	mu     sync.Mutex
	failed []time.Time
}

func (f *flaky) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if f.fail.Load() {
		f.mu.Lock()
		f.failed = append(f.failed, time.Now())
		f.mu.Unlock()
		return 0, errTransient
	}
	tok, err := f.Locker.Acquire(ctx, key, owner, ttl)
	if err == nil && f.hang.Load() {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	return tok, err
}

func (f *flaky) Inspect(ctx context.Context, key string) (driver.Info, error) {
	return f.Locker.(driver.Inspector).Inspect(ctx, key)
}

func (f *flaky) failures() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.failed...)
}

// TestElectionCampaignLeavesNothing: a Campaign that fails or is cancelled
// leaves nothing held, though the server made the grant: the grant whose
// reply never came is released in the background, at once (not at the
// lock's 30s TTL), and Close waits for that release. A Campaign cancelled
// while it waits for another leader takes nothing either.
func TestElectionCampaignLeavesNothing(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	s := mem.NewStore()
	other := locker.New(s.Locker())
	defer other.Close()
	free := func() bool {
		_, err := other.Election("e").Leader(ctx)
		return errors.Is(err, locker.ErrNotHeld)
	}
	takeAndGive := func(what string) {
		t.Helper()
		lk, err := other.TryAcquire(ctx, locker.ElectionPrefix+"e")
		if err != nil {
			t.Fatalf("%s: the election's key is not free: %v", what, err)
		}
		_ = lk.Release(ctx)
	}

	// Cancelled in flight: the grant is made, the reply never comes.
	f := &flaky{Locker: s.Locker()}
	f.hang.Store(true)
	a := locker.New(f)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	lk, err := a.Election("e").Campaign(cctx, "a")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || lk != nil {
		t.Fatalf("Campaign whose reply never came: %v, %v; want DeadlineExceeded", lk, err)
	}
	at := time.Now()
	waitFor(t, time.Second, "the release of the grant whose reply was lost", free)
	t.Logf("the election's key was free %v after the cancelled Campaign returned", time.Since(at).Round(time.Microsecond))
	takeAndGive("cancelled in flight")
	a.Close()

	// The same, with Close right after: Close waits for the clean-up.
	f = &flaky{Locker: s.Locker()}
	f.hang.Store(true)
	a = locker.New(f)
	cctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = a.Election("e").Campaign(cctx, "a")
	cancel()
	if err == nil {
		t.Fatal("Campaign whose reply never came succeeded")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !free() {
		t.Fatal("the election's key is still held once Close returned")
	}
	takeAndGive("closed")

	// Cancelled while waiting for another leader: nothing taken, then or
	// once that leader resigns.
	b := locker.New(s.Locker())
	defer b.Close()
	lb, err := b.Election("e").Campaign(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	a = locker.New(s.Locker())
	defer a.Close()
	cctx, cancel = context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		lk, err := a.Election("e").Campaign(cctx, "a")
		if lk != nil {
			_ = lk.Release(ctx)
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it wait (either way, it must take nothing)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Campaign cancelled while waiting: %v, want Canceled", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !free() {
		t.Fatal("the election's key is held after the only leader resigned")
	}
	takeAndGive("cancelled while waiting")
}

// TestElectionLeadRetries: while every campaign fails with a backend
// error, Lead goes on campaigning, backing off (not a busy loop, and never
// more than 2s between attempts, with jitter); once the backend answers
// again it is elected, within that backoff, and runs fn.
func TestElectionLeadRetries(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	f := &flaky{Locker: mem.NewStore().Locker()}
	f.fail.Store(true)
	l := locker.New(f)
	defer l.Close()
	errStop := errors.New("stop")
	elected := make(chan uint64, 1)
	done := make(chan error, 1)
	go func() {
		done <- l.Election("e").Lead(ctx, "v", func(_ context.Context, term uint64) error {
			elected <- term
			return errStop
		})
	}()
	// Until the backoff has reached a gap of at least 1s (5ms doubling:
	// about 1.3s of failures).
	waitFor(t, 10*time.Second, "a retry 1s after the one before", func() bool {
		at := f.failures()
		return len(at) > 1 && at[len(at)-1].Sub(at[len(at)-2]) >= time.Second
	})
	select {
	case err := <-done:
		t.Fatalf("Lead returned while the backend failed: %v", err)
	default:
	}
	// One more failure after the cap is reached (2s, jittered).
	n := len(f.failures())
	waitFor(t, 10*time.Second, "another retry", func() bool { return len(f.failures()) > n })
	f.fail.Store(false)
	cleared := time.Now()
	at := f.failures()
	var gaps []time.Duration
	for i := 1; i < len(at); i++ {
		gaps = append(gaps, at[i].Sub(at[i-1]).Round(time.Millisecond))
	}
	t.Logf("%d failed campaigns, gaps %v", len(at), gaps)
	if len(at) > 20 {
		t.Errorf("%d campaigns in %v: no backoff", len(at), at[len(at)-1].Sub(at[0]))
	}
	const most = 2*time.Second*12/10 + 600*time.Millisecond // the cap, its jitter, a loaded machine
	for _, g := range gaps {
		if g > most {
			t.Errorf("a gap of %v between campaigns, more than %v", g, most)
		}
	}
	select {
	case term := <-elected:
		t.Logf("elected (term %d) %v after the backend answered again", term, time.Since(cleared).Round(time.Millisecond))
		if d := time.Since(cleared); d > most {
			t.Errorf("elected %v after the backend answered again, more than %v", d, most)
		}
	case err := <-done:
		t.Fatalf("Lead returned before being elected: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not elected within 10s of the backend answering again")
	}
	if err := <-done; !errors.Is(err, errStop) {
		t.Fatalf("Lead: %v, want fn's error", err)
	}
}
