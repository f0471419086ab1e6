package driver

import (
	"context"
	"time"
)

// RefreshItem is one lock of a BatchRefresher.RefreshBatch: the arguments
// of one Refresh.
type RefreshItem struct {
	Key   string
	Owner string
	TTL   time.Duration
}

// BatchRefresher is implemented by a Locker that can refresh many locks in
// one request to its server (a Redis pipeline, one statement). Package
// locker sends the automatic renewals that fall due together on one Locker
// through it, and calls Refresh one lock at a time on a driver without it.
type BatchRefresher interface {
	// RefreshBatch does what Refresh does, for each item, and returns one
	// error per item, in the order of items (nil: that lock was
	// refreshed). Each item is checked on its own: it refreshes the lock
	// it names only if its owner holds it, and otherwise gets ErrNotHeld
	// and changes nothing; its ttl counts from the call, replaces the one
	// in force and never revives an expired lock; a bad item (an empty
	// key or owner, a non-positive ttl) gets ErrInvalid. One item's
	// failure never changes another item's outcome: the batch refreshes
	// exactly the locks it names and whose owners hold them, and nothing
	// else. A failure of the request as a whole (ctx done, the server
	// unreachable, ErrClosed) is reported on every item it affects. Items
	// naming the same key are refreshed in order. An empty batch returns
	// an empty slice and makes no request.
	RefreshBatch(ctx context.Context, items []RefreshItem) []error
}
