package postgres

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
)

// faultsURLEnv carries the server's URL to the child process of the
// conformance suite's Faults/Pause.
const faultsURLEnv = "LOCKER_POSTGRES_FAULTS_URL"

// faultServer returns the server the conformance tests use: a private one
// they may restart, or $LOCKER_TEST_POSTGRES_URL's (srv is then nil, and the
// restart subtests are not run), or, in Faults/Pause's child, the parent's.
func faultServer(t *testing.T) (string, *pgtest.Server) {
	if u := os.Getenv(faultsURLEnv); u != "" {
		return u, nil
	}
	if u := os.Getenv(EnvURL); u != "" {
		return u, nil
	}
	srv := pgtest.Start(t, "max_connections=300")
	return srv.URL(), srv
}

// faultHarness returns a conformance Harness for the server at rawURL with
// the fault hooks it can stage: each Locker reaches the server through its
// own fault proxy (Cut blackholes it, Reset resets its connections);
// Restart crashes the server (SIGKILL to every process) and starts it again
// with crash recovery, when srv is not nil; Pause holds a lock from a child
// process. PostgreSQL never loses committed data, so there is no
// RestartEmpty.
func faultHarness(t *testing.T, rawURL string, srv *pgtest.Server, open func(ctx context.Context, url string) (driver.Locker, error), bound map[string]time.Duration) conformance.Harness {
	var mu sync.Mutex
	proxies := map[driver.Locker]*faultproxy.Proxy{}
	proxyOf := func(d driver.Locker) (*faultproxy.Proxy, error) {
		mu.Lock()
		defer mu.Unlock()
		if p := proxies[d]; p != nil {
			return p, nil
		}
		return nil, fmt.Errorf("%T was not opened by this Harness", d)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	h := conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			p, err := faultproxy.New(u.Host)
			if err != nil {
				return nil, err
			}
			pu := *u
			pu.Host = p.Addr()
			d, err := open(ctx, pu.String())
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
		MinTTL: 100 * time.Millisecond,
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
		ChildEnv:  []string{faultsURLEnv + "=" + rawURL},
		LostBound: bound,
	}
	if srv != nil {
		h.Restart = func(context.Context) error {
			srv.Restart(t)
			return nil
		}
	}
	return h
}

// advisoryLostBound is how much later than another owner's grant an
// advisory lock's holder may hear of its loss when its session ends (a
// reset connection, a server crash): the lock is freed with the session,
// and the session watch (watch_linux.go) closes Lost within milliseconds,
// which TestSessionFault* bound at 100ms.
var advisoryLostBound = map[string]time.Duration{"Reset": 100 * time.Millisecond, "Restart": 100 * time.Millisecond}

func TestConformance(t *testing.T) {
	u, srv := faultServer(t)
	conformance.Run(t, faultHarness(t, u, srv, func(ctx context.Context, url string) (driver.Locker, error) {
		return Open(ctx, url)
	}, advisoryLostBound))
}
