package etcd

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

var _ driver.ChangeWatcher = (*Locker)(nil)

// WatchChanges implements driver.ChangeWatcher: a watch of key's lock key
// (one watcher on the client's shared watch stream) calls changed after
// each response with events: a grant puts the key, a release or an expiry
// deletes it (etcd deletes a lease's keys when it expires or is revoked).
// It returns once the server has confirmed the watch, so nothing after
// the return is missed. The client resumes a watch across a reconnect by
// itself, from the last revision it saw; a watch the server cancels (the
// member lost its leader, or the revisions to resume from were compacted)
// is made again, with backoff from 10ms to 1s, and changed is called once
// it is.
//
// Errors: driver.ErrInvalid for a bad key; driver.ErrClosed after Close;
// ctx.Err() (wrapped) if ctx is done when it is called, or ctx.Err() or
// the server's error if the first watch cannot be confirmed within ctx.
func (l *Locker) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if err := l.check("watch changes", key, "-"); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		// Before the watch: a confirmation already in hand would win a
		// race with the done ctx half the time.
		return nil, fmt.Errorf("etcd: watch changes: %w", err)
	}
	wctx, cancel := context.WithCancel(l.base)
	k := l.LockKey(key)
	wch, wstop, err := l.watchKey(ctx, wctx, k)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("etcd: watch changes of %.100q: %w", key, err)
	}
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("etcd: watch changes: %w", driver.ErrClosed)
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		l.followChanges(wctx, k, wch, wstop, changed)
	}()
	var once sync.Once
	return func() { once.Do(cancel) }, nil
}

// watchKey starts a watch of every change of k, living in wctx, and waits,
// within ctx, for the server to confirm it. stop ends it.
func (l *Locker) watchKey(ctx, wctx context.Context, k string) (wch clientv3.WatchChan, stop func(), err error) {
	return l.startWatch(ctx, wctx, k)
}

// followChanges calls changed for each response with events on wch, and
// replaces the watch when the server cancels it, until wctx ends.
func (l *Locker) followChanges(wctx context.Context, k string, wch clientv3.WatchChan, stop func(), changed func()) {
	for {
		for r := range wch {
			if r.Canceled || r.Err() != nil {
				break
			}
			if len(r.Events) > 0 {
				l.prefetchTTL(r.Events[len(r.Events)-1])
				changed()
			}
		}
		stop()
		backoff := 10 * time.Millisecond
		for {
			if wctx.Err() != nil {
				return
			}
			var err error
			if wch, stop, err = l.watchKey(wctx, wctx, k); err == nil {
				break
			}
			if !sleepCtx(wctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
		}
		changed() // a change while the watch was down may have been missed
	}
}

// leaseTTLs holds the reads of a lease's remaining TTL that a change watch
// starts as it reports a grant, so that the Inspect the report prompts
// (Election.Observe's) takes that read instead of making its own after its
// Get: the grant is then seen one round trip sooner.
type leaseTTLs struct {
	mu sync.Mutex
	m  map[clientv3.LeaseID]*ttlRead
}

// ttlRead is one TimeToLive of a lease, sent at sent; done is closed once
// ttl or err is set.
type ttlRead struct {
	sent time.Time
	done chan struct{}
	ttl  int64
	err  error
}

// ttlReadAge is how long before an Inspect a read it takes may have been
// sent: a change watch's report is followed by its observer's Inspect at
// once, and the lease's remaining TTL is reported in whole seconds anyway.
const ttlReadAge = 100 * time.Millisecond

// prefetchTTL starts a read of the lease of the key ev put, in the
// background, for the Inspect that the report of ev will prompt.
func (l *Locker) prefetchTTL(ev *clientv3.Event) {
	if ev.Type != clientv3.EventTypePut || ev.Kv == nil || ev.Kv.Lease == 0 {
		return
	}
	id := clientv3.LeaseID(ev.Kv.Lease)
	rd := &ttlRead{sent: time.Now(), done: make(chan struct{})}
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		return
	}
	l.bg.Add(1)
	l.mu.Unlock()
	l.ttls.mu.Lock()
	if l.ttls.m == nil {
		l.ttls.m = map[clientv3.LeaseID]*ttlRead{}
	}
	for old, r := range l.ttls.m {
		if time.Since(r.sent) > ttlReadAge {
			delete(l.ttls.m, old) // never taken
		}
	}
	l.ttls.m[id] = rd
	l.ttls.mu.Unlock()
	go func() {
		defer l.bg.Done()
		defer close(rd.done)
		ctx, cancel := l.opCtx(l.base)
		defer cancel()
		t, err := l.c.TimeToLive(ctx, id)
		if err == nil {
			rd.ttl = t.TTL
		}
		rd.err = err
	}()
}

// takeTTL returns the read of lease id a change watch started no earlier
// than ttlReadAge before now, once it has its answer, and forgets it; ok is
// false if there is none, it failed, or ctx ended first.
func (l *Locker) takeTTL(ctx context.Context, id clientv3.LeaseID) (ttl int64, ok bool) {
	l.ttls.mu.Lock()
	rd := l.ttls.m[id]
	delete(l.ttls.m, id)
	l.ttls.mu.Unlock()
	if rd == nil || time.Since(rd.sent) > ttlReadAge {
		return 0, false
	}
	select {
	case <-rd.done:
		return rd.ttl, rd.err == nil
	case <-ctx.Done():
		return 0, false
	}
}
