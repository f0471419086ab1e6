package postgres

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

// leaseURL returns url with mode=lease.
func leaseURL(url string) string {
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
	url := leaseURL(serverURL(t))
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			return Driver{}.Open(url)
		},
		MinTTL: 100 * time.Millisecond,
	})
}
