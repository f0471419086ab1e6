package redis

import (
	"context"
	"testing"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// TestShared: one EVALSHA per shared operation, a SIGKILLed permit
// holder's permit back within 100ms after its TTL, a writer among 8
// looping readers, opaque keys and owners, Redlock's refusal
// (drivertest.Shared).
func TestShared(t *testing.T) { drivertest.Shared(t, "redis", urlOf, openShared) }

func openShared(u string) (driver.Locker, error) { return Open(context.Background(), u) }

// BenchmarkSharedInterleaved: drivertest.SharedInterleaved.
func BenchmarkSharedInterleaved(b *testing.B) { drivertest.SharedInterleaved(b, urlOf, openShared) }
