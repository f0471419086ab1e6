package locker

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the OpenTelemetry instrumentation scope of the meter and the
// tracer a Locker reports to.
const ScopeName = "github.com/go-locker/locker"

// Attribute keys of the instruments and spans (see WithMeterProvider).
const (
	attrDriver = attribute.Key("locker.driver")
	attrResult = attribute.Key("locker.result")
	attrCause  = attribute.Key("locker.cause")
	attrKey    = attribute.Key("locker.key")
	attrToken  = attribute.Key("locker.token")
	attrKind   = attribute.Key("locker.kind")
)

// OpenOption configures a Locker: New, Open and OpenURL take any number of
// them. The defaults report metrics and spans to the global OpenTelemetry
// providers and log nothing.
type OpenOption func(*config)

type config struct {
	meter   metric.MeterProvider
	tracer  trace.TracerProvider
	logger  *slog.Logger
	keyName func(string) string
}

// WithMeterProvider sets where a Locker's metrics go. The default, also
// used for nil, is otel.GetMeterProvider() at the time the Locker is made:
// the global provider, which records nothing until the program installs an
// SDK with otel.SetMeterProvider, and forwards to that SDK from then on.
//
// Instruments, of scope ScopeName. Every one carries the attributes
// locker.driver (the name the driver was registered under, for Open and
// OpenURL; "custom" for New) and locker.kind (election for the lock of an
// election, a key beginning with ElectionPrefix; mutex for every other
// lock), and, under WithKeyName, locker.key.
//
//   - locker.acquire.duration, histogram, s: each Acquire and TryAcquire
//     call from start to return, waiting included; locker.result is
//     acquired, not_acquired (the key is held by another owner), canceled
//     (the context ended) or error (anything else: bad input, ErrClosed,
//     ErrUnavailable, …).
//   - locker.hold.duration, histogram, s: from the grant (the start of the
//     call that won it) until Release is called or Lost closes.
//   - locker.renewals, counter: each background renewal and Refresh call
//     that reached the driver; locker.result is ok, lost (told ErrNotHeld)
//     or error (anything else; renewal retries it until the safe deadline).
//   - locker.lost, counter: each closing of Lost; locker.cause is the
//     LostCause.
//   - locker.held, up-down counter: locks held now through the Locker.
//   - locker.election.terms, counter: terms won through the Locker, one
//     each time a Campaign (or Lead) is elected.
//
// With the global provider and no SDK installed, durations are not
// measured (no clock is read for them) until one is. Tested by
// TestMetricsAcquire, TestMetricsRenewals, TestMetricsDriverAndKeyName,
// TestLostCauses and TestGlobalProvidersByDefault.
func WithMeterProvider(mp metric.MeterProvider) OpenOption {
	return func(c *config) { c.meter = mp }
}

// WithTracerProvider sets where a Locker's spans go. The default, also used
// for nil, is otel.GetTracerProvider(), the global provider, which records
// nothing until the program installs an SDK.
//
// Spans, of scope ScopeName: "locker.acquire" for each Acquire and
// "locker.try_acquire" for each TryAcquire, with an event "locker.wait"
// when the call had to wait (its attribute locker.wait.in is "locker" when
// the first attempt found the key held, "server" when the call is queued in
// the server of a driver.BlockingAcquirer, which every Acquire on such a
// driver is); and "locker.release" for each Lock.Release. They carry
// locker.driver, locker.result on acquires, locker.token (the fencing
// token) on a grant and on a release, and locker.key under WithKeyName.
// Inside a recording span, each driver call the operation makes is a child
// span, of kind client, carrying locker.driver ("locker.driver.acquire",
// "locker.driver.acquire_wait", "locker.driver.refresh",
// "locker.driver.release"); a Lock.Refresh inside the caller's recording
// span makes one too. Renewals make no spans: their outcome is in
// locker.renewals and the logger.
//
// With the global provider and no SDK installed, no span is started at
// all: the Locker checks, with one atomic load per call, whether an SDK has
// been installed since. Tested by TestSpans and
// TestGlobalProvidersByDefault.
func WithTracerProvider(tp trace.TracerProvider) OpenOption {
	return func(c *config) { c.tracer = tp }
}

// WithLogger sets a logger for what an operator should see: every
// background renewal that failed (at Warn, with the error and the time left
// before the safe deadline), and every loss (at Warn, with the LostCause
// and the error; at Info for CauseClosed, which the program asked for).
// Records carry the key, the token and the driver name. The default, also
// used for nil, is to log nothing.
func WithLogger(logger *slog.Logger) OpenOption {
	return func(c *config) { c.logger = logger }
}

// WithKeyName maps keys to names of low cardinality, e.g. "tenant/*" for
// every key under "tenant/", reported as the attribute locker.key on every
// instrument and span of that key. A key mapped to "" gets no locker.key.
// name must be safe for concurrent use and return one of a small, fixed set
// of names: each distinct name is a separate time series, kept by the
// Locker for its life. The default, also used for nil, puts no key in any
// attribute: keys are unbounded. Log records always carry the key itself.
func WithKeyName(name func(key string) string) OpenOption {
	return func(c *config) { c.keyName = name }
}

// Values of locker.result and locker.cause, indexed by the constants below.
var (
	acquireResults = [...]string{"acquired", "not_acquired", "canceled", "error"}
	renewalResults = [...]string{"ok", "lost", "error"}
	lostCauses     = [...]LostCause{CauseExpired, CauseTaken, CauseDeadline, CauseClosed, CauseMaxHold, CauseServer}
)

const (
	acquireAcquired = iota
	acquireNotAcquired
	acquireCanceled
	acquireError
)

const (
	renewalOK = iota
	renewalLost
	renewalError
)

func causeIndex(c LostCause) int {
	for i, v := range lostCauses {
		if v == c {
			return i
		}
	}
	return 0
}

// durationBuckets spans a sub-millisecond uncontended acquire to an hour's
// hold, in seconds.
var durationBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
	0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600,
}

// telemetry holds a Locker's instruments, tracer and logger. A Locker
// without one (nil) records nothing and makes no OpenTelemetry calls.
type telemetry struct {
	// lazyTP and lazyMP are the global providers' placeholders when the
	// Locker uses them and no SDK was installed when it was made; nil
	// otherwise. See tracing and metering.
	lazyTP     trace.TracerProvider
	lazyMP     metric.MeterProvider
	tracer     trace.Tracer
	acquireDur metric.Float64Histogram
	holdDur    metric.Float64Histogram
	renewals   metric.Int64Counter
	lost       metric.Int64Counter
	held       metric.Int64UpDownCounter
	terms      metric.Int64Counter
	logger     *slog.Logger
	driver     string
	keyName    func(string) string

	plain    *attrSets // for keys without a name
	election *attrSets // for election keys without a name

	mu    sync.Mutex
	named map[namedSets]*attrSets
}

// namedSets identifies the attribute sets of a key name.
type namedSets struct {
	name     string
	election bool
}

// attrSets holds the measurement options of one (driver, key name) pair,
// built once so that recording allocates nothing.
type attrSets struct {
	base    []attribute.KeyValue // for spans
	acquire [len(acquireResults)][]metric.RecordOption
	hold    []metric.RecordOption
	held    []metric.AddOption
	renew   [len(renewalResults)][]metric.AddOption
	lost    [len(lostCauses)][]metric.AddOption
	term    []metric.AddOption
}

func newAttrSets(base ...attribute.KeyValue) *attrSets {
	s := &attrSets{base: base}
	rec := func(kv ...attribute.KeyValue) []metric.RecordOption {
		return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, base...), kv...)...))}
	}
	add := func(kv ...attribute.KeyValue) []metric.AddOption {
		return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(append([]attribute.KeyValue{}, base...), kv...)...))}
	}
	for i, r := range acquireResults {
		s.acquire[i] = rec(attrResult.String(r))
	}
	s.hold = rec()
	s.held = add()
	s.term = s.held
	for i, r := range renewalResults {
		s.renew[i] = add(attrResult.String(r))
	}
	for i, c := range lostCauses {
		s.lost[i] = add(attrCause.String(string(c)))
	}
	return s
}

func newTelemetry(driverName string, c config) *telemetry {
	mp, tp := c.meter, c.tracer
	var lazyMP metric.MeterProvider
	var lazyTP trace.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
		if isPlaceholder(mp, "meterProvider") {
			lazyMP = mp
		}
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
		if isPlaceholder(tp, "tracerProvider") {
			lazyTP = tp
		}
	}
	m := mp.Meter(ScopeName)
	t := &telemetry{
		lazyMP:   lazyMP,
		lazyTP:   lazyTP,
		tracer:   tp.Tracer(ScopeName),
		logger:   c.logger,
		driver:   driverName,
		keyName:  c.keyName,
		plain:    newAttrSets(attrDriver.String(driverName), attrKind.String("mutex")),
		election: newAttrSets(attrDriver.String(driverName), attrKind.String("election")),
		named:    map[namedSets]*attrSets{},
	}
	var errs [6]error
	t.acquireDur, errs[0] = m.Float64Histogram("locker.acquire.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of Acquire and TryAcquire calls, waiting included."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	t.holdDur, errs[1] = m.Float64Histogram("locker.hold.duration",
		metric.WithUnit("s"),
		metric.WithDescription("How long locks were held, from the grant to Release or loss."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	t.renewals, errs[2] = m.Int64Counter("locker.renewals",
		metric.WithUnit("{renewal}"),
		metric.WithDescription("Renewals and Refresh calls, by result."))
	t.lost, errs[3] = m.Int64Counter("locker.lost",
		metric.WithUnit("{lock}"),
		metric.WithDescription("Locks lost, by cause."))
	t.held, errs[4] = m.Int64UpDownCounter("locker.held",
		metric.WithUnit("{lock}"),
		metric.WithDescription("Locks held now."))
	t.terms, errs[5] = m.Int64Counter("locker.election.terms",
		metric.WithUnit("{term}"),
		metric.WithDescription("Election terms won, one per elected Campaign."))
	if err := errors.Join(errs[:]...); err != nil {
		otel.Handle(err)
	}
	// A provider that fails to make an instrument may return nil with its
	// error; record nothing there rather than crash.
	var noop metricnoop.Meter
	if t.acquireDur == nil {
		t.acquireDur, _ = noop.Float64Histogram("")
	}
	if t.holdDur == nil {
		t.holdDur, _ = noop.Float64Histogram("")
	}
	if t.renewals == nil {
		t.renewals, _ = noop.Int64Counter("")
	}
	if t.lost == nil {
		t.lost, _ = noop.Int64Counter("")
	}
	if t.held == nil {
		t.held, _ = noop.Int64UpDownCounter("")
	}
	if t.terms == nil {
		t.terms, _ = noop.Int64Counter("")
	}
	return t
}

// isPlaceholder reports whether p is the global provider that OpenTelemetry
// hands out until a program installs an SDK (otel.SetMeterProvider,
// otel.SetTracerProvider): a *tracerProvider or *meterProvider of package
// go.opentelemetry.io/otel/internal/global, which records nothing until it
// is given a delegate. Should that type ever move, this reports false and
// the Locker simply makes every call, as with an explicit provider.
func isPlaceholder(p any, name string) bool {
	rt := reflect.TypeOf(p)
	return rt != nil && rt.Kind() == reflect.Pointer &&
		rt.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global" && rt.Elem().Name() == name
}

// tracing reports whether spans can be recorded: an explicit provider was
// given, or an SDK has been installed globally since the Locker was made
// (the global placeholder is then no longer what otel.GetTracerProvider
// returns, and our tracer forwards to the SDK). Until then starting a span
// would only allocate a non-recording one, so none is started. It costs an
// atomic load.
func (t *telemetry) tracing() bool {
	return t.lazyTP == nil || otel.GetTracerProvider() != t.lazyTP
}

// metering is tracing for metrics: the durations, which cost clock
// readings, are measured only once something can record them.
func (t *telemetry) metering() bool {
	return t.lazyMP == nil || otel.GetMeterProvider() != t.lazyMP
}

// sets returns the attribute sets for key.
func (t *telemetry) sets(key string) *attrSets {
	election := strings.HasPrefix(key, ElectionPrefix)
	plain := t.plain
	if election {
		plain = t.election
	}
	if t.keyName == nil || key == "" || len(key) > maxKeyLen {
		return plain
	}
	name := t.keyName(key)
	if name == "" {
		return plain
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.named[namedSets{name, election}]
	if s == nil {
		kind := "mutex"
		if election {
			kind = "election"
		}
		s = newAttrSets(attrDriver.String(t.driver), attrKind.String(kind), attrKey.String(name))
		t.named[namedSets{name, election}] = s
	}
	return s
}

// term counts a term won; attrs are the election lock's.
func (t *telemetry) term(attrs *attrSets) {
	if attrs == nil {
		attrs = t.election
	}
	t.terms.Add(context.Background(), 1, attrs.term...)
}

// acquireOp is one Acquire or TryAcquire call in flight.
type acquireOp struct {
	start time.Time  // zero when not metering
	span  trace.Span // nil when not tracing
	attrs *attrSets
}

func (t *telemetry) startAcquire(ctx context.Context, key string, wait bool) (context.Context, acquireOp) {
	op := acquireOp{attrs: t.sets(key)}
	if t.metering() {
		op.start = time.Now()
	}
	if t.tracing() {
		name := "locker.try_acquire"
		if wait {
			name = "locker.acquire"
		}
		ctx, op.span = t.tracer.Start(ctx, name)
		if op.span.IsRecording() {
			op.span.SetAttributes(op.attrs.base...)
		}
	}
	return ctx, op
}

func acquireResult(err error) int {
	switch {
	case err == nil:
		return acquireAcquired
	case errors.Is(err, ErrNotAcquired):
		return acquireNotAcquired
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return acquireCanceled
	}
	return acquireError
}

func (t *telemetry) endAcquire(ctx context.Context, op acquireOp, lk *Lock, err error) {
	res := acquireResult(err)
	if !op.start.IsZero() {
		t.acquireDur.Record(ctx, time.Since(op.start).Seconds(), op.attrs.acquire[res]...)
	}
	if op.span == nil {
		return
	}
	if op.span.IsRecording() {
		op.span.SetAttributes(attrResult.String(acquireResults[res]))
		if lk != nil {
			op.span.SetAttributes(attrToken.Int64(int64(lk.token)))
		}
		if res == acquireError {
			op.span.RecordError(err)
			op.span.SetStatus(codes.Error, err.Error())
		}
	}
	op.span.End()
}

// waitEvent marks the acquire span in ctx as having waited.
func (t *telemetry) waitEvent(ctx context.Context, where string) {
	if t == nil {
		return
	}
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		s.AddEvent("locker.wait", trace.WithAttributes(attribute.String("locker.wait.in", where)))
	}
}

// child starts a span for a driver call, only inside a recording span of
// ours: it costs nothing otherwise. end is never nil.
func (t *telemetry) child(ctx context.Context, name string) (context.Context, func(error)) {
	if t == nil || !t.tracing() || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, endNothing
	}
	ctx, s := t.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrDriver.String(t.driver)))
	return ctx, func(err error) {
		if err != nil {
			s.RecordError(err)
			s.SetStatus(codes.Error, err.Error())
		}
		s.End()
	}
}

func endNothing(error) {}

// startRelease starts the span of a Release; nil when not tracing.
func (t *telemetry) startRelease(ctx context.Context, lk *Lock) (context.Context, trace.Span) {
	if !t.tracing() {
		return ctx, nil
	}
	ctx, s := t.tracer.Start(ctx, "locker.release")
	if s.IsRecording() {
		s.SetAttributes(lk.attrs.base...)
		s.SetAttributes(attrToken.Int64(int64(lk.token)))
	}
	return ctx, s
}

func endRelease(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil && s.IsRecording() {
		s.RecordError(err)
		s.SetStatus(codes.Error, err.Error())
	}
	s.End()
}

func (t *telemetry) holdStart(attrs *attrSets) {
	t.held.Add(context.Background(), 1, attrs.held...)
}

// holdStart and holdEnd always count locker.held, whether or not metering,
// so that it stays balanced across the installation of an SDK.
func (t *telemetry) holdEnd(attrs *attrSets, start time.Time) {
	ctx := context.Background()
	t.held.Add(ctx, -1, attrs.held...)
	if t.metering() {
		t.holdDur.Record(ctx, time.Since(start).Seconds(), attrs.hold...)
	}
}

func (t *telemetry) renewal(lk *Lock, res int, err error, auto bool) {
	t.renewals.Add(context.Background(), 1, lk.attrs.renew[res]...)
	if res == renewalError && auto && t.logger != nil {
		t.logger.LogAttrs(context.Background(), slog.LevelWarn, "locker: renewal failed",
			slog.String("driver", t.driver), slog.String("key", lk.key), slog.Uint64("token", lk.token),
			slog.Duration("deadline_in", time.Until(lk.Deadline())), slog.Any("error", err))
	}
}

func (t *telemetry) lostCount(lk *Lock, e *lostError) {
	t.lost.Add(context.Background(), 1, lk.attrs.lost[causeIndex(e.cause)]...)
}

func (t *telemetry) lostLog(lk *Lock, e *lostError) {
	if t.logger == nil {
		return
	}
	level := slog.LevelWarn
	if e.cause == CauseClosed {
		level = slog.LevelInfo
	}
	t.logger.LogAttrs(context.Background(), level, "locker: lock lost",
		slog.String("driver", t.driver), slog.String("key", lk.key), slog.Uint64("token", lk.token),
		slog.String("cause", string(e.cause)), slog.Any("error", error(e)))
}
