package redis

import (
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// FuzzKeyOwner fuzzes the key and the owner through a grant, Inspect, a
// queued handoff and the hold watch on one server (see
// drivertest.FuzzKeyOwner); go test runs its seeds: spaces, colons,
// newlines, braces, non-UTF-8 bytes, an empty key and an empty owner.
func FuzzKeyOwner(f *testing.F) { drivertest.FuzzKeyOwner(f, urls) }
