package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestConformance runs the shared suite against a real etcd server.
func TestConformance(t *testing.T) {
	url := testURL(t) + uniquePrefix(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			return Driver{}.Open(url)
		},
		MinTTL: DefaultMinTTL,
	})
}
