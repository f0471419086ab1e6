package drivertest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// addrEnv carries the server's address to the child process of
// conformance's Faults/Pause.
const addrEnv = "LOCKER_REDIS_FAULTS_ADDR"

// FaultServer starts the server for FaultHarness: with an append-only file
// synced on every write, so that Restart keeps every grant. In the child
// process of Faults/Pause it starts nothing and returns the parent's
// address.
func FaultServer(t *testing.T) (addr string, s *redistest.Server) {
	if a := os.Getenv(addrEnv); a != "" {
		return a, nil
	}
	s = redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
	return s.Addr, s
}

// FaultHarness returns a conformance Harness for one Redis server with
// every fault hook: each Locker reaches the server through its own fault
// proxy (Cut blackholes it, Reset resets its connections); Restart kills the
// server with SIGKILL and starts it again from its append-only file;
// RestartEmpty flushes the data first, as a restart without persistence
// loses it; Pause holds a lock from a child process. open opens a Locker on
// a server address. s is nil in the child process.
//
// LostBound: a restart that loses the data frees the lock at once; the
// holder hears at its next renewal (every TTL/3) or from its HoldWatcher
// when the watch reconnects, so another owner may be granted up to that
// long before Lost closes.
func FaultHarness(t *testing.T, addr string, s *redistest.Server, open func(addr string) (driver.Locker, error)) conformance.Harness {
	px := conformance.NewProxied([]string{addr}, func(_ context.Context, addrs []string) (driver.Locker, error) {
		return open(addrs[0])
	})
	t.Cleanup(func() { _ = px.Close() })
	h := conformance.Harness{
		Open:      px.Open,
		Cut:       px.Cut,
		Reset:     px.Reset,
		Pause:     true,
		ChildEnv:  []string{addrEnv + "=" + addr},
		LostBound: map[string]time.Duration{"RestartEmpty": 250 * time.Millisecond},
	}
	if s != nil {
		h.Restart = func(context.Context) error {
			s.Restart()
			return nil
		}
		h.RestartEmpty = func(context.Context) error {
			if _, err := s.Do("FLUSHALL", "SYNC"); err != nil {
				return fmt.Errorf("FLUSHALL: %w", err)
			}
			s.Restart()
			return nil
		}
	}
	return h
}
