package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// announced reports whether the grants of key are announced (NOTIFY) in
// lease mode: those of election keys only, so that a plain lock's acquire
// pays nothing for it (a NOTIFY serializes the commits that send one).
func announced(key string) bool { return strings.HasPrefix(key, locker.ElectionPrefix) }

// watchChanges is WatchChanges in lease mode: a second listener connection
// per leaseLocker (outside the pool, opened by the first watch) LISTENs on
// the release channel and on the grant channel, on which the acquire
// statement announces each grant when it commits. changed is called, from
// one goroutine per watch, after each notification for key, and once after
// the listener reconnected (a change in between may have been missed).
func (l *leaseLocker) watchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if key == "" {
		return nil, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("postgres: watch changes: %w", err)
	}
	if !announced(key) {
		return nil, fmt.Errorf("postgres: lease mode announces the grants of election keys only (prefix %q), not of %.100q: %w",
			locker.ElectionPrefix, key, errors.ErrUnsupported)
	}
	wake, cancel, err := l.listen(ctx, &l.clis, leaseID(l.ns, key), leaseChannel, leaseGrantChannel)
	if errors.Is(err, errListenPooler) {
		return nil, fmt.Errorf("%w: %w", err, errors.ErrUnsupported) // a refusal: the deployment cannot notify
	}
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		cancel()
		return nil, driver.ErrClosed
	}
	l.bg.Add(1)
	l.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer l.bg.Done()
		for {
			select {
			case <-wake:
				changed()
			case <-done:
				return
			case <-l.ctx.Done():
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			close(done)
		})
	}, nil
}
