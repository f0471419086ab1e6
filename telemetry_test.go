package locker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

var instruments = []string{
	"locker.acquire.duration", "locker.hold.duration", "locker.renewals", "locker.lost", "locker.held",
}

// metrics is an SDK MeterProvider with a manual reader.
type metrics struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMetrics(t *testing.T) *metrics {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &metrics{reader: r, mp: mp}
}

// point is one data point of any of the instruments.
type point struct {
	name  string
	attrs attribute.Set
	value float64 // counter and up-down counter value; histogram sum
	count uint64  // histogram count; 0 for the others
}

func (m *metrics) points(t *testing.T) []point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var ps []point
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != locker.ScopeName {
			t.Fatalf("scope %q, want %q", sm.Scope.Name, locker.ScopeName)
		}
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Histogram[float64]:
				if mt.Unit != "s" {
					t.Errorf("%s: unit %q, want s", mt.Name, mt.Unit)
				}
				for _, dp := range d.DataPoints {
					ps = append(ps, point{mt.Name, dp.Attributes, dp.Sum, dp.Count})
				}
			case metricdata.Sum[int64]:
				if d.IsMonotonic != (mt.Name != "locker.held") {
					t.Errorf("%s: monotonic %v", mt.Name, d.IsMonotonic)
				}
				for _, dp := range d.DataPoints {
					ps = append(ps, point{mt.Name, dp.Attributes, float64(dp.Value), 0})
				}
			default:
				t.Fatalf("%s: unexpected data %T", mt.Name, mt.Data)
			}
		}
	}
	return ps
}

// kv is "attribute=value" for an attribute that must be present.
func has(set attribute.Set, want []string) bool {
	for _, w := range want {
		k, v, _ := strings.Cut(w, "=")
		got, ok := set.Value(attribute.Key(k))
		if !ok || got.String() != v {
			return false
		}
	}
	return true
}

// sum adds up the values (counters) or counts (histograms) of the points of
// name that carry every attribute in want ("key=value").
func sum(ps []point, name string, want ...string) float64 {
	var n float64
	for _, p := range ps {
		if p.name != name || !has(p.attrs, want) {
			continue
		}
		if p.count > 0 || strings.HasSuffix(name, ".duration") {
			n += float64(p.count)
		} else {
			n += p.value
		}
	}
	return n
}

// checkAttrs fails unless every point carries locker.driver = drv, and
// locker.key only if keyed.
func checkAttrs(t *testing.T, ps []point, drv string, keyed bool) {
	t.Helper()
	for _, p := range ps {
		if !has(p.attrs, []string{"locker.driver=" + drv}) {
			t.Errorf("%s %v: locker.driver is not %q", p.name, p.attrs.ToSlice(), drv)
		}
		if _, ok := p.attrs.Value("locker.key"); ok && !keyed {
			t.Errorf("%s %v: a key attribute without WithKeyName", p.name, p.attrs.ToSlice())
		}
	}
}

// expect polls the metrics until sum(name, want...) == n.
func (m *metrics) expect(t *testing.T, n float64, name string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := sum(m.points(t), name, want...)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %v = %v, want %v", name, want, got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// logs captures slog records.
type logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *logs) Enabled(context.Context, slog.Level) bool { return true }
func (h *logs) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h *logs) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *logs) WithGroup(string) slog.Handler      { return h }

// find returns the records with message msg, as "LEVEL k=v k=v" strings.
func (h *logs) find(msg string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.recs {
		if r.Message != msg {
			continue
		}
		s := r.Level.String()
		r.Attrs(func(a slog.Attr) bool {
			s += " " + a.Key + "=" + a.Value.String()
			return true
		})
		out = append(out, s)
	}
	return out
}

// The acquire outcomes, a wait and a handoff: locker.acquire.duration counts
// each call under its result and includes the wait; locker.held and
// locker.hold.duration follow the lock.
func TestMetricsAcquire(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	m := newMetrics(t)
	l := locker.New(waiting{f}, locker.WithMeterProvider(m.mp))
	defer l.Close()
	other := locker.New(st.Locker())
	defer other.Close()
	ctx := ctxT(t, 30*time.Second)

	held, err := other.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := l.Acquire(short, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a short deadline: %v", err)
	}
	if _, err := l.Acquire(ctx, ""); !errors.Is(err, locker.ErrInvalid) {
		t.Fatalf("Acquire with an empty key: %v", err)
	}

	// Wait and handoff: Acquire waits while other holds k.
	got := make(chan *locker.Lock, 1)
	gotErr := make(chan error, 1)
	start := time.Now()
	go func() { // reports through channels only: it may outlive a failed test
		lk, err := l.Acquire(ctx, "k")
		gotErr <- err
		got <- lk
	}()
	// Attempts so far: TryAcquire, the first of Acquire(short), and the
	// waiter's first.
	waitFor(t, 10*time.Second, "the waiter's first attempt", func() bool { return f.acquires.Load() >= 3 })
	const holdFor = 100 * time.Millisecond
	time.Sleep(holdFor) // the wait the histogram must show
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-gotErr; err != nil {
		t.Fatal(err)
	}
	lk := <-got
	waited := time.Since(start)
	m.expect(t, 1, "locker.held")
	ps := m.points(t)
	checkAttrs(t, ps, "custom", false)
	for res, n := range map[string]float64{"acquired": 1, "not_acquired": 1, "canceled": 1, "error": 1} {
		if got := sum(ps, "locker.acquire.duration", "locker.result="+res); got != n {
			t.Errorf("locker.acquire.duration{result=%s} count %v, want %v", res, got, n)
		}
	}
	for _, p := range ps {
		if p.name == "locker.acquire.duration" && has(p.attrs, []string{"locker.result=acquired"}) {
			if s := time.Duration(p.value * float64(time.Second)); s < holdFor || s > waited {
				t.Errorf("the waiting Acquire recorded %v, want between %v and %v", s, holdFor, waited)
			}
		}
	}
	if n := sum(ps, "locker.hold.duration"); n != 0 {
		t.Errorf("locker.hold.duration count %v while the lock is held", n)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	m.expect(t, 0, "locker.held")
	m.expect(t, 1, "locker.hold.duration")
	if n := sum(m.points(t), "locker.lost"); n != 0 {
		t.Errorf("locker.lost = %v after a Release", n)
	}
}

// Renewals are counted by result: ok while the server answers, error while
// it does not, lost when it says the lock is gone.
func TestMetricsRenewals(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	m := newMetrics(t)
	l := locker.New(f, locker.WithMeterProvider(m.mp))
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := 300 * time.Millisecond
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "two renewals", func() bool {
		return sum(m.points(t), "locker.renewals", "locker.result=ok") >= 2
	})
	f.setFailRefresh(errTransient)
	waitFor(t, 10*time.Second, "a failed renewal", func() bool {
		return sum(m.points(t), "locker.renewals", "locker.result=error") >= 1
	})
	f.setFailRefresh(nil)
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ps := m.points(t)
	checkAttrs(t, ps, "custom", false)
	if n := sum(ps, "locker.renewals", "locker.result=lost"); n != 0 {
		t.Fatalf("renewals{lost} = %v", n)
	}
	// The server ends the lock: the next renewal is told so.
	lk, err = l.Acquire(ctx, "k2", locker.WithTTL(ttl), locker.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Locker().Release(ctx, "k2", "me"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	m.expect(t, 1, "locker.renewals", "locker.result=lost")
	m.expect(t, 1, "locker.lost", "locker.cause=expired")
}

// Open and OpenURL report the registered driver name; WithKeyName adds
// locker.key to every instrument of the keys it names, and only to those.
func TestMetricsDriverAndKeyName(t *testing.T) {
	m := newMetrics(t)
	tenant := func(key string) string {
		if strings.HasPrefix(key, "tenant/") {
			return "tenant/*"
		}
		return ""
	}
	l, err := locker.OpenURL("mem://metrics-driver-name", locker.WithMeterProvider(m.mp), locker.WithKeyName(tenant))
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	for _, key := range []string{"tenant/1", "tenant/2", "global"} {
		lk, err := l.Acquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	lk, err := l.Acquire(ctx, "tenant/3")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost after Close")
	ps := m.points(t)
	checkAttrs(t, ps, "mem", true)
	for _, name := range instruments {
		if sum(ps, name, "locker.key=tenant/*") == 0 && name != "locker.held" && name != "locker.renewals" {
			t.Errorf("%s has no point with locker.key=tenant/*", name)
		}
	}
	if n := sum(ps, "locker.acquire.duration", "locker.key=tenant/*"); n != 3 {
		t.Errorf("acquires of tenant/*: %v, want 3", n)
	}
	if n := sum(ps, "locker.acquire.duration"); n != 4 {
		t.Errorf("acquires: %v, want 4", n)
	}
	if n := sum(ps, "locker.lost", "locker.key=tenant/*", "locker.cause=closed"); n != 1 {
		t.Errorf("lost{tenant/*, closed} = %v, want 1", n)
	}
	for _, p := range ps {
		if v, ok := p.attrs.Value("locker.key"); ok && v.String() != "tenant/*" {
			t.Errorf("%s: locker.key=%q", p.name, v.String())
		}
	}
	l2, err := locker.Open("mem", "mem://metrics-driver-name", locker.WithMeterProvider(nil), nil)
	if err != nil {
		t.Fatalf("Open with nil options: %v", err)
	}
	l2.Close()
}

// Spans: one per Acquire, TryAcquire and Release, the wait as an event,
// driver calls as children, results and tokens as attributes; renewals
// make none.
func TestSpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	st := mem.NewStore()
	l := locker.New(waiting{newFaulty(st)}, locker.WithTracerProvider(tp),
		locker.WithKeyName(func(string) string { return "jobs" }))
	defer l.Close()
	other := locker.New(st.Locker())
	defer other.Close()
	ctx := ctxT(t, 30*time.Second)

	held, err := other.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatal(err)
	}
	time.AfterFunc(50*time.Millisecond, func() { held.Release(context.Background()) })
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(150*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // pacing: renewals happen, which must make no spans
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(-1)); !errors.Is(err, locker.ErrInvalid) {
		t.Fatal(err)
	}

	spans := sr.Ended()
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = append(byName[s.Name()], s)
		if s.InstrumentationScope().Name != locker.ScopeName {
			t.Errorf("span %s: scope %q", s.Name(), s.InstrumentationScope().Name)
		}
		if !hasKV(s.Attributes(), "locker.driver=custom") ||
			!strings.HasPrefix(s.Name(), "locker.driver.") && !hasKV(s.Attributes(), "locker.key=jobs") {
			t.Errorf("span %s: attributes %v", s.Name(), s.Attributes())
		}
	}
	names := slices.Sorted(maps.Keys(byName))
	want := []string{"locker.acquire", "locker.driver.acquire", "locker.driver.release", "locker.release", "locker.try_acquire"}
	if !slices.Equal(names, want) {
		t.Fatalf("span names %v, want %v (no renewal spans)", names, want)
	}
	if n := len(byName["locker.try_acquire"]); n != 2 {
		t.Fatalf("%d try_acquire spans", n)
	}
	notAcq, bad := byName["locker.try_acquire"][0], byName["locker.try_acquire"][1]
	if !hasKV(notAcq.Attributes(), "locker.result=not_acquired") || notAcq.Status().Code == codes.Error {
		t.Errorf("TryAcquire of a held key: %v %v", notAcq.Attributes(), notAcq.Status())
	}
	if !hasKV(bad.Attributes(), "locker.result=error") || bad.Status().Code != codes.Error {
		t.Errorf("TryAcquire with a bad TTL: %v %v", bad.Attributes(), bad.Status())
	}
	acq := byName["locker.acquire"][0]
	if !hasKV(acq.Attributes(), "locker.result=acquired") || !hasKV(acq.Attributes(), fmt.Sprintf("locker.token=%d", lk.Token())) {
		t.Errorf("Acquire span attributes %v", acq.Attributes())
	}
	if ev := acq.Events(); len(ev) != 1 || ev[0].Name != "locker.wait" || !hasKV(ev[0].Attributes, "locker.wait.in=locker") {
		t.Errorf("Acquire span events %v, want one locker.wait", ev)
	}
	children := 0
	for _, c := range byName["locker.driver.acquire"] {
		if c.Parent().SpanID() == acq.SpanContext().SpanID() {
			children++
		}
	}
	if children < 2 {
		t.Errorf("%d driver acquire spans under the waiting Acquire, want at least 2 (the first attempt and the grant)", children)
	}
	rel := byName["locker.release"][0]
	if !hasKV(rel.Attributes(), fmt.Sprintf("locker.token=%d", lk.Token())) {
		t.Errorf("Release span attributes %v", rel.Attributes())
	}
	if c := byName["locker.driver.release"][0]; c.Parent().SpanID() != rel.SpanContext().SpanID() {
		t.Errorf("driver release span is not a child of the Release span")
	}

	// A driver that queues in the server: the wait event says so.
	sr2 := tracetest.NewSpanRecorder()
	tp2 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr2))
	defer tp2.Shutdown(context.Background())
	lb := locker.New(&blocking{faulty: newFaulty(st)}, locker.WithTracerProvider(tp2))
	defer lb.Close()
	lk, err = lb.Acquire(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(ctx)
	var parent, child sdktrace.ReadOnlySpan
	for _, s := range sr2.Ended() {
		switch s.Name() {
		case "locker.acquire":
			parent = s
		case "locker.driver.acquire_wait":
			child = s
		}
	}
	if parent == nil || child == nil || child.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("want a locker.acquire span with a locker.driver.acquire_wait child: %v", sr2.Ended())
	}
	if ev := parent.Events(); len(ev) != 1 || !hasKV(ev[0].Attributes, "locker.wait.in=server") {
		t.Errorf("Acquire on a blocking driver: events %v, want one server wait", ev)
	}
}

func hasKV(kvs []attribute.KeyValue, want string) bool {
	return has(attribute.NewSet(kvs...), []string{want})
}

// envGlobalChild makes TestGlobalProvidersByDefault run as the child
// process that installs global providers.
const envGlobalChild = "LOCKER_TEST_GLOBAL_OTEL_CHILD"

// Without options a Locker reports to the global providers, including one
// installed after the Locker was made, and logs nothing (not even to
// slog's default logger). Until an SDK is installed it starts no span and
// reads no clock for durations (Lazy). It runs in a child process, since
// global providers cannot be uninstalled.
func TestGlobalProvidersByDefault(t *testing.T) {
	if os.Getenv(envGlobalChild) == "1" {
		globalChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGlobalProvidersByDefault$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envGlobalChild+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("global providers: ok")) {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func globalChild(t *testing.T) {
	l := locker.New(mem.NewStore().Locker()) // before any provider is installed
	defer l.Close()
	if !locker.Lazy(l) {
		t.Fatal("a Locker on the global placeholders does not defer to them")
	}
	m := newMetrics(t)
	otel.SetMeterProvider(m.mp)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	otel.SetTracerProvider(tp)
	h := &logs{}
	slog.SetDefault(slog.New(h))
	if locker.Lazy(l) {
		t.Fatal("still deferring once SDKs are installed")
	}
	late := locker.New(mem.NewStore().Locker()) // after: the SDKs directly
	defer late.Close()
	if locker.Lazy(late) {
		t.Fatal("a Locker made after the SDKs were installed defers")
	}

	ctx := ctxT(t, 30*time.Second)
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk, err = l.Acquire(ctx, "k", locker.WithTTL(50*time.Millisecond), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
	m.expect(t, 1, "locker.lost", "locker.cause=deadline", "locker.driver=custom")
	m.expect(t, 2, "locker.acquire.duration", "locker.result=acquired", "locker.driver=custom")
	if _, err := late.TryAcquire(ctx, "other"); err != nil {
		t.Fatal(err)
	}
	m.expect(t, 3, "locker.acquire.duration", "locker.result=acquired")
	var names []string
	for _, s := range sr.Ended() {
		names = append(names, s.Name())
	}
	slices.Sort(names)
	want := []string{"locker.acquire", "locker.acquire", "locker.driver.acquire", "locker.driver.acquire",
		"locker.driver.acquire", "locker.driver.release", "locker.release", "locker.try_acquire"}
	if !slices.Equal(names, want) {
		t.Fatalf("spans %v, want %v", names, want)
	}
	if r := h.find("locker: lock lost"); len(r) != 0 {
		t.Fatalf("logged without WithLogger: %v", r)
	}
	fmt.Println("global providers: ok")
}

// Each loss closes Lost with its cause: Err matches ErrNotHeld and that
// one LostCause, never ErrNotAcquired; Refresh and Release return the same
// error; locker.lost counts it under that cause, locker.held drops to 0 and
// locker.hold.duration records the hold; the logger gets one record.
func TestLostCauses(t *testing.T) {
	type env struct {
		st    *mem.Store
		f     *faulty
		l     *locker.Locker
		other *locker.Locker
		w     *watching
		ctx   context.Context
	}
	ttl := 600 * time.Millisecond
	for _, tc := range []struct {
		cause     locker.LostCause
		renewLost float64 // renewals{lost} expected
		wrap      func(*env) driver.Locker
		lose      func(*testing.T, *env) *locker.Lock
	}{
		{locker.CauseDeadline, 0, nil, func(t *testing.T, e *env) *locker.Lock {
			// A paused renewer: every renewal blocks until its timeout.
			e.f.pauseRefresh(true)
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(ttl))
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
			return lk
		}},
		{locker.CauseExpired, 1, func(e *env) driver.Locker { return fastClock{e.f} }, func(t *testing.T, e *env) *locker.Lock {
			// The server's TTL runs out before the first renewal.
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(2*ttl))
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
			return lk
		}},
		{locker.CauseTaken, 1, func(e *env) driver.Locker { return fastClock{e.f} }, func(t *testing.T, e *env) *locker.Lock {
			// The lock expires on the server, another owner takes it, and
			// a Refresh is told so.
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(4*ttl), locker.WithAutoRenew(false))
			next := mustAcquire(t, e.other, e.ctx, "k")
			defer next.Release(e.ctx)
			err := lk.Refresh(e.ctx, 4*ttl)
			if !errors.Is(err, locker.CauseTaken) {
				t.Fatalf("Refresh: %v", err)
			}
			return lk
		}},
		{locker.CauseServer, 0, func(e *env) driver.Locker { e.w = &watching{Locker: e.f}; return e.w }, func(t *testing.T, e *env) *locker.Lock {
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(ttl), locker.WithOwner("me"))
			if !e.w.fire("me", fmt.Errorf("%w: session ended", driver.ErrNotHeld)) {
				t.Fatal("no watch")
			}
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
			return lk
		}},
		{locker.CauseClosed, 0, nil, func(t *testing.T, e *env) *locker.Lock {
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(ttl))
			if err := e.l.Close(); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
			return lk
		}},
		{locker.CauseMaxHold, 0, nil, func(t *testing.T, e *env) *locker.Lock {
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(ttl), locker.WithMaxHold(ttl/2))
			waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
			return lk
		}},
		{locker.CauseExpired, 0, nil, func(t *testing.T, e *env) *locker.Lock {
			// Release finds the lock gone (deleted behind its back).
			lk := mustAcquire(t, e.l, e.ctx, "k", locker.WithTTL(ttl), locker.WithOwner("me"), locker.WithAutoRenew(false))
			if err := e.st.Locker().Release(e.ctx, "k", "me"); err != nil {
				t.Fatal(err)
			}
			if err := lk.Release(e.ctx); !errors.Is(err, locker.CauseExpired) {
				t.Fatalf("Release of a deleted lock: %v", err)
			}
			return lk
		}},
	} {
		t.Run(string(tc.cause), func(t *testing.T) {
			e := &env{st: mem.NewStore(), ctx: ctxT(t, 30*time.Second)}
			e.f = newFaulty(e.st)
			m := newMetrics(t)
			h := &logs{}
			var d driver.Locker = e.f
			if tc.wrap != nil {
				d = tc.wrap(e)
			}
			e.l = locker.New(d, locker.WithMeterProvider(m.mp), locker.WithLogger(slog.New(h)))
			defer e.l.Close()
			e.other = locker.New(e.st.Locker())
			defer e.other.Close()

			lk := tc.lose(t, e)
			err := lk.Err()
			if !errors.Is(err, locker.ErrNotHeld) || !errors.Is(err, tc.cause) || errors.Is(err, locker.ErrNotAcquired) {
				t.Fatalf("Err() = %v, want ErrNotHeld and %s, not ErrNotAcquired", err, tc.cause)
			}
			var cause locker.LostCause
			if !errors.As(err, &cause) || cause != tc.cause {
				t.Fatalf("errors.As(Err()) = %q, want %q", cause, tc.cause)
			}
			if rerr := lk.Release(e.ctx); !errors.Is(rerr, tc.cause) {
				t.Errorf("Release after the loss: %v", rerr)
			}
			if rerr := lk.Refresh(e.ctx, ttl); !errors.Is(rerr, tc.cause) {
				t.Errorf("Refresh after the loss: %v", rerr)
			}
			m.expect(t, 1, "locker.lost", "locker.cause="+string(tc.cause))
			m.expect(t, 1, "locker.lost")
			m.expect(t, 0, "locker.held")
			m.expect(t, 1, "locker.hold.duration")
			checkAttrs(t, m.points(t), "custom", false)
			level := "WARN"
			if tc.cause == locker.CauseClosed {
				level = "INFO"
			}
			waitFor(t, 10*time.Second, "the log record", func() bool { return len(h.find("locker: lock lost")) == 1 })
			r := h.find("locker: lock lost")[0]
			if !strings.HasPrefix(r, level+" ") || !strings.Contains(r, "cause="+string(tc.cause)) || !strings.Contains(r, "key=k") {
				t.Errorf("log record %q", r)
			}
			if tc.cause == locker.CauseDeadline {
				if n := sum(m.points(t), "locker.renewals", "locker.result=error"); n < 1 {
					t.Errorf("renewals{error} = %v under a paused renewer", n)
				}
				if r := h.find("locker: renewal failed"); len(r) == 0 || !strings.HasPrefix(r[0], "WARN ") {
					t.Errorf("renewal failures logged: %v", r)
				}
			}
			if n := sum(m.points(t), "locker.renewals", "locker.result=lost"); n != tc.renewLost {
				t.Errorf("renewals{lost} = %v, want %v", n, tc.renewLost)
			}
		})
	}
}

func mustAcquire(t *testing.T, l *locker.Locker, ctx context.Context, key string, opts ...locker.Option) *locker.Lock {
	t.Helper()
	lk, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return lk
}

// Do's context ends with the Lock's error as its cause, and Do's error
// matches the same cause.
func TestDoContextCause(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	var cause error
	err := l.Do(ctx, "k", func(ctx context.Context) error {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return nil
	}, locker.WithMaxHold(100*time.Millisecond))
	if !errors.Is(cause, locker.CauseMaxHold) || !errors.Is(cause, locker.ErrNotHeld) {
		t.Fatalf("context cause %v", cause)
	}
	if !errors.Is(err, locker.CauseMaxHold) || !strings.Contains(err.Error(), cause.Error()) {
		t.Fatalf("Do: %v, want the cause %v", err, cause)
	}
}

// BenchmarkTelemetryOverhead measures what the default instrumentation
// (the global providers with no SDK installed) adds to an uncontended
// Acquire + Release on the mem driver, against the same path with every
// OpenTelemetry call skipped (NewUninstrumented). A second uninstrumented
// Locker is the control: its ratio to the first shows the noise of the
// measurement. The three run in turn, in blocks of 256 pairs inside one
// benchmark, on one store and key, the order rotated every round, so that
// all see the same machine, heap and timer state. It reports the ns per
// pair of each, the ratios otel/bare and control/bare, and the allocations
// per pair.
//
//	heavy go test -run '^$' -bench TelemetryOverhead -count 10 .
func BenchmarkTelemetryOverhead(b *testing.B) {
	st := mem.NewStore()
	ctx := context.Background()
	lockers := []*locker.Locker{
		locker.New(st.Locker()),               // otel: the default
		locker.NewUninstrumented(st.Locker()), // bare
		locker.NewUninstrumented(st.Locker()), // control
	}
	for _, l := range lockers {
		defer l.Close()
	}
	pair := func(l *locker.Locker) {
		lk, err := l.Acquire(ctx, "k")
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	const block = 256
	var spent [3]time.Duration
	b.ResetTimer()
	for i, round := 0, 0; i < b.N; i, round = i+block, round+1 {
		n := min(block, b.N-i)
		for k := range 3 {
			side := (round + k) % 3
			start := time.Now()
			for range n {
				pair(lockers[side])
			}
			spent[side] += time.Since(start)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(spent[0].Nanoseconds())/float64(b.N), "otel-ns/pair")
	b.ReportMetric(float64(spent[1].Nanoseconds())/float64(b.N), "bare-ns/pair")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "ratio")
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "control-ratio")
	b.ReportMetric(testing.AllocsPerRun(200, func() { pair(lockers[0]) }), "otel-allocs/pair")
	b.ReportMetric(testing.AllocsPerRun(200, func() { pair(lockers[1]) }), "bare-allocs/pair")
}

// The library depends on the OpenTelemetry API only: no SDK package is
// among its imports (the tests use one).
func TestNoSDKInLibraryImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/go-locker/locker", "github.com/go-locker/locker/drivers/mem").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "go.opentelemetry.io/otel/metric") || !slices.Contains(deps, "go.opentelemetry.io/otel/trace") {
		t.Fatalf("the OpenTelemetry API is not among the imports: %v", deps)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "go.opentelemetry.io/otel/sdk") || strings.HasPrefix(d, "go.opentelemetry.io/otel/exporters") {
			t.Errorf("the library imports %s", d)
		}
	}
}
