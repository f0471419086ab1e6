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

func openLeaseT(t testing.TB, url string) *LeaseLocker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := OpenLease(ctx, url)
	if err != nil {
		t.Fatalf("OpenLease: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// The conformance suite in lease mode, connected directly.
func TestLeaseConformance(t *testing.T) {
	u, srv := faultServer(t)
	// A lease outlives its connection and a crash: no fault may free it
	// early, so no LostBound.
	conformance.Run(t, faultHarness(t, leaseURL(u), srv, func(ctx context.Context, url string) (driver.Locker, error) {
		return Driver{}.Open(url)
	}, nil))
}

// The conformance suite in lease mode through a real PgBouncer in
// transaction mode: every statement is autocommit and uses no named
// prepared statement, and waits fall back to the holder's TTL: Subscribe
// returns ErrListenPooler, and Driver.Open returns a Locker without it.
func TestLeaseConformancePgBouncer(t *testing.T) {
	srv := pgtest.Start(t, "max_connections=200")
	port := srv.StartPgBouncer(t)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&mode=lease", port)
	l := openLeaseT(t, url)
	if !l.pooler {
		t.Fatal("PgBouncer not detected")
	}
	if _, _, err := l.Subscribe(ctxFor(t, 10*time.Second), "k"); !errors.Is(err, ErrListenPooler) {
		t.Fatalf("Subscribe through PgBouncer: %v, want ErrListenPooler", err)
	}
	d, err := Driver{}.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, ok := d.(driver.Waiter); ok {
		t.Fatal("Driver.Open behind PgBouncer returned a driver.Waiter")
	}
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			return Driver{}.Open(url)
		},
		MinTTL: 100 * time.Millisecond,
	})
}
