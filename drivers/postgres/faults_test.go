package postgres

import (
	"context"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
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
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	px := conformance.NewProxied([]string{u.Host}, func(ctx context.Context, addrs []string) (driver.Locker, error) {
		pu := *u
		pu.Host = addrs[0]
		return open(ctx, pu.String())
	})
	t.Cleanup(func() { _ = px.Close() })
	h := conformance.Harness{
		Open:      px.Open,
		MinTTL:    faultUnit,
		Cut:       px.Cut,
		Reset:     px.Reset,
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

// faultUnit is the suite's time unit in both modes. Faults/Reset resets
// one Locker's connections about once a unit, and every Locker of the fault
// track runs a mutex, an election and two shared contenders, each on
// sessions of its own (an advisory hold keeps its session; lease mode's
// waits listen on one), so each reset breaks eight to twelve sessions,
// which the pool opens again; a new PostgreSQL session costs about 20 ms of
// CPU on the CI machine (pgbench -C: 21.6 ms average connection time). At
// 100 ms the resets outran the server's starting of sessions, and no
// shared hold was ever granted.
const faultUnit = 250 * time.Millisecond

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
