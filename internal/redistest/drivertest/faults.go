package drivertest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/conformance/faultproxy"
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
	var mu sync.Mutex
	proxies := map[driver.Locker]*faultproxy.Proxy{}
	proxyOf := func(d driver.Locker) (*faultproxy.Proxy, error) {
		mu.Lock()
		defer mu.Unlock()
		if p := proxies[d]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("drivertest: %T was not opened by this Harness", d)
	}
	h := conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			p, err := faultproxy.New(addr)
			if err != nil {
				return nil, err
			}
			d, err := open(p.Addr())
			if err != nil {
				_ = p.Close()
				return nil, err
			}
			mu.Lock()
			proxies[d] = p
			mu.Unlock()
			t.Cleanup(func() { _ = p.Close() })
			return d, nil
		},
		Cut: func(d driver.Locker) (func(), error) {
			p, err := proxyOf(d)
			if err != nil {
				return nil, err
			}
			p.Blackhole()
			return p.Heal, nil
		},
		Reset: func(d driver.Locker) error {
			p, err := proxyOf(d)
			if err != nil {
				return err
			}
			p.Reset()
			return nil
		},
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
