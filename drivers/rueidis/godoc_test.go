package rueidis

import (
	"context"
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
	"github.com/redis/rueidis"
)

// The constructors' shape (a compile-time check).
var (
	_ func(context.Context, string) (*Locker, error)                     = Open
	_ func(context.Context, rueidis.Client, *Options) (*Locker, error)   = New
	_ func(context.Context, []rueidis.Client, *Options) (*Locker, error) = NewRedlock
)

// What go doc shows (drivertest.CheckGoDoc): the Locker's methods, declared here and
// documented; every Options field documented with its default; no exported
// alias.
func TestGoDoc(t *testing.T) {
	drivertest.CheckGoDoc(t, []string{"Acquire", "AcquireShared", "AcquireWait", "Capabilities", "Close", "Inspect", "InspectShared", "Ping", "Refresh", "RefreshBatch", "RefreshShared", "Release", "ReleaseShared", "SharedUnsupported", "Subscribe", "WatchChanges", "WatchHold"})
}
