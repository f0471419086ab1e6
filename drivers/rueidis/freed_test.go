package rueidis

import (
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// TestFairOddKeys: keys, owners and prefixes with spaces, colons,
// newlines, braces and non-UTF-8 bytes: a queued handoff and a nudged
// takeover within 100ms, Inspect and the hold watch, on one server and a
// Cluster (see drivertest.OddKeys).
func TestFairOddKeys(t *testing.T) { drivertest.OddKeysModes(t, urls) }

// TestFairFreed: every way a held key becomes free (release, min-hold
// release, shorter refresh then a crash, expiry, the waiter before it
// cancelled or closed) grants the queued waiter within 100ms, and a
// closed waiter leaves no queue entry, on one server and a Cluster (see
// drivertest.FairFreed).
func TestFairFreed(t *testing.T) { drivertest.FairFreedModes(t, urls) }
