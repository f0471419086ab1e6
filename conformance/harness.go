package conformance

import (
	"context"
	"time"

	"github.com/go-locker/locker/driver"
)

// Harness tells Run how to reach the backend under test.
type Harness struct {
	// Open returns a fresh driver.Locker on the backend under test. Each
	// call stands for a separate process: the suite opens several and makes
	// them contend. It is called from several goroutines at once (subtests
	// run side by side). Run closes every Locker it opens.
	Open func(ctx context.Context) (driver.Locker, error)
	// MinTTL is the shortest TTL the backend honours; the suite scales its
	// timings to it (its unit TTL is MinTTL, at least 100ms). Zero means
	// 100ms.
	MinTTL time.Duration
}
