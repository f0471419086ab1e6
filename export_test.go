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
