package locker

import "github.com/go-locker/locker/driver"

// NewUninstrumented is New with no telemetry at all: every OpenTelemetry
// call is skipped (Locker.tel is nil), so the acquire and release path runs
// as if instrumentation were compiled out. BenchmarkTelemetryOverhead
// compares it with the default.
func NewUninstrumented(d driver.Locker) *Locker {
	l := New(d)
	l.tel = nil
	return l
}

// Lazy reports whether l defers to the global placeholders: no span is
// started and no duration measured until an SDK is installed.
func Lazy(l *Locker) bool {
	return l.tel != nil && l.tel.lazyTP != nil && l.tel.lazyMP != nil && !l.tel.tracing() && !l.tel.metering()
}

// HoldBatches keeps the renewals that fall due on l waiting in its pending
// batch (l's driver must be a driver.BatchRefresher) until release is
// called, which sends them as one batch; pending reports how many wait.
func HoldBatches(l *Locker) (pending func() int, release func()) {
	b := l.batch
	g := make(chan struct{})
	b.mu.Lock()
	b.gate = g
	b.mu.Unlock()
	pending = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.pending)
	}
	release = func() {
		b.mu.Lock()
		b.gate = nil
		b.mu.Unlock()
		close(g)
		b.flush()
	}
	return pending, release
}
