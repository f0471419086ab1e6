package rueidis

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/internal/rediscore"
)

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
