package file

import (
	"context"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

var _ driver.ChangeWatcher = (*Locker)(nil)

// WatchChanges implements driver.ChangeWatcher over the inotify watch that
// serves Subscribe: changed is called after each write of key's lock file
// by any process (a grant, a refresh, a release; an expiry writes nothing)
// and its removal, and on a directory event that may have been missed (an
// inotify queue overflow). Should inotify be unavailable it is called
// every 50ms instead. Errors: ErrInvalid for an empty key, ErrClosed after
// Close, and ctx.Err() wrapped.
func (l *Locker) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if err := l.check(ctx, key, "-", 0, false); err != nil {
		return nil, err
	}
	s, err := l.newSubscription(key)
	if err != nil {
		return nil, err
	}
	var tick <-chan time.Time
	var ticker *time.Ticker
	if s.w == nil {
		ticker = time.NewTicker(pollInterval)
		tick = ticker.C
	}
	go func() {
		if ticker != nil {
			defer ticker.Stop()
		}
		for {
			select {
			case <-s.done:
				return
			case <-s.poke:
			case <-tick:
			}
			changed()
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { s.stop(false) }) }, nil
}
