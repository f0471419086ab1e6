package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
)

// leaseURL returns url with mode=lease.
func leaseURL(url string) string {
	if strings.Contains(url, "mode=lease") {
		return url
	}
	if strings.Contains(url, "?") {
		return url + "&mode=lease"
	}
	return url + "?mode=lease"
}

func openLeaseT(t testing.TB, url string) *Locker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := Open(ctx, leaseURL(url))
	if err != nil {
		t.Fatalf("Open in lease mode: %v", err)
	}
	if l.Mode() != ModeLease {
		t.Fatalf("Open with mode=lease: mode %q", l.Mode())
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// The conformance suite in lease mode, connected directly.
func TestLeaseConformance(t *testing.T) {
	u, srv := faultServer(t)
	// A lease outlives its connection and a crash: no fault may free it
	// early, so no LostBound.
	h := faultHarness(t, leaseURL(u), srv, func(ctx context.Context, url string) (driver.Locker, error) {
		return Driver{}.Open(url)
	}, nil)
	conformance.Run(t, h)
}

// The conformance suite in lease mode through a real PgBouncer in
// transaction mode: every statement is autocommit and uses no named
// prepared statement, and waits fall back to the holder's TTL and backoff:
// the wait's subscription returns errListenPooler.
func TestLeaseConformancePgBouncer(t *testing.T) {
	srv := pgtest.Start(t, "max_connections=200")
	port := srv.StartPgBouncer(t)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&mode=lease", port)
	l := openLeaseT(t, url)
	if !l.lease.pooler {
		t.Fatal("PgBouncer not detected")
	}
	if _, _, err := l.lease.subscribe(ctxFor(t, 10*time.Second), "k"); !errors.Is(err, errListenPooler) {
		t.Fatalf("subscribe through PgBouncer: %v, want errListenPooler", err)
	}
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			return Driver{}.Open(url)
		},
		MinTTL: 100 * time.Millisecond,
	})
}
