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
//
// Re-reads that fall due together go out as one DoMulti (SetBatchReader).
func newHoldWatch(client func() rueidis.Client, prefix string) *rediscore.HoldWatch {
	h := rediscore.NewHoldWatch(func(ctx context.Context, lock string) (string, bool, error) {
		watch := client()
		r := holdRead(watch.Do(ctx, watch.B().Get().Key(lock).Build().Pin())) // pinned: see doFunc
		return r.Value, r.Exists, r.Err
	}, prefix)
	h.SetBatchReader(func(ctx context.Context, locks []string) []rediscore.HoldRead {
		watch := client()
		cmds := make(rueidis.Commands, len(locks))
		for i, lock := range locks {
			cmds[i] = watch.B().Get().Key(lock).Build().Pin()
		}
		out := make([]rediscore.HoldRead, len(locks))
		for i, r := range watch.DoMulti(ctx, cmds...) {
			out[i] = holdRead(r)
		}
		return out
	})
	return h
}

// holdRead converts the result of a GET of a lock key.
func holdRead(r rueidis.RedisResult) rediscore.HoldRead {
	v, err := r.ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return rediscore.HoldRead{}
	case err != nil:
		return rediscore.HoldRead{Err: err}
	}
	return rediscore.HoldRead{Value: v, Exists: true}
}
