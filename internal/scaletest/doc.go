// Package scaletest holds the many-locks test of issue 23: one Locker holds
// thousands of locks with a short TTL, taken by 64 concurrent acquirers,
// against a fresh default server of each backend, and none may be refused
// or lost. The client runs in a child process of its own, so that its CPU
// per renewal is measured apart from an embedded server's.
//
// By default (as in CI) it runs a reduced size: 500 locks held for 5s.
// LOCKER_SCALE=1 runs the full size, 10,000 locks held for 30s:
//
//	LOCKER_SCALE=1 go test -count=1 -v -timeout 20m ./internal/scaletest
//
// Redis runs on both clients (go-redis and rueidis), renewing in batches
// (driver.BatchRefresher); LOCKER_SCALE_UNBATCHED=1 adds a run of each
// with batching hidden, one renewal per call, for comparison.
//
// See docs/testing.md and docs/benchmarks.md.
package scaletest
