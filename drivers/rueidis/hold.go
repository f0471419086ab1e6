package rueidis

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

var _ driver.HoldWatcher = (*Locker)(nil)

// WatchHold implements driver.HoldWatcher with client-side-caching
// invalidations (see the package documentation, "Watching a held lock"):
// lost is called when key is deleted, evicted, expires or is overwritten
// by another grant. The Locker's own refreshes are re-read and not
// reported. Supported on Lockers from Open (single server, Cluster,
// Sentinel) and NewWithClientOption; Redlock and adopted clients (New,
// NewRedlock) return an error, and their locks are watched by renewal
// alone. Errors: driver.ErrClosed after Close.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	select {
	case <-l.closed:
		return nil, fmt.Errorf("rueidis: %w", driver.ErrClosed)
	default:
	}
	if l.hold == nil {
		return nil, errors.New("rueidis: hold watching needs a Locker from Open (not Redlock) or NewWithClientOption")
	}
	return l.hold.Watch(key, owner, token, lost)
}

// newHoldWatch returns a HoldWatch that reads on client(), the watch client whose
// connections track every key they read (CLIENT TRACKING ON OPTOUT) and
// whose invalidations the cscWaiter passes on. The read is a plain GET, not
// DoCache: a cached value could predate the grant (its invalidation may
// still be on the way), and a stale read must never report a loss.
func newHoldWatch(client func() rueidis.Client, prefix string) *rediscore.HoldWatch {
	return rediscore.NewHoldWatch(func(ctx context.Context, lock string) (string, bool, error) {
		watch := client()
		v, err := watch.Do(ctx, watch.B().Get().Key(lock).Build().Pin()).ToString() // pinned: see doFunc
		if rueidis.IsRedisNil(err) {
			return "", false, nil
		}
		if err != nil {
			return "", false, err
		}
		return v, true, nil
	}, prefix)
}
