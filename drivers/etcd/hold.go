package etcd

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

var _ driver.HoldWatcher = (*Locker)(nil)

// WatchHold implements driver.HoldWatcher: it watches the lock key of key,
// from the revision of the grant (token) on, and calls lost once the key is
// deleted (released through another Locker with the same owner, deleted by
// hand, or its lease revoked or expired on the server: etcd deletes a
// lease's keys with it) or overwritten with another value or as a new
// incarnation. The owner's own changes through this Locker are not a loss:
// a Refresh or an idempotent Acquire keeps the value and the create
// revision (even when it moves the key to a lease of a new TTL), and a
// delete made by this Locker's Release ends the watch silently. Starting from the grant's own
// revision, the watch misses nothing that happened between the grant and
// the call.
//
// Each grant is one watcher on the client's shared watch stream (etcd's
// client multiplexes every watch of a client and context kind onto one gRPC
// stream), so watching many locks opens no more connections or streams;
// the server sends an event only when the lock key changes.
//
// A watch that breaks is not a loss. The client resumes a watch across a
// reconnect by itself, from the last revision it saw, so a partition or a
// member restart delays the report but loses no event. A watch the server
// cancels (the member lost its leader, or the revisions to resume from were
// compacted) is replaced after a linearizable read of the key: lost is
// called if the read shows the grant gone, else the watch resumes after the
// read's revision. While no read succeeds (no quorum, no connection) the
// grant is presumed held and nothing is reported: package locker's renewal
// and safe deadline still end the lock in time.
//
// Errors: driver.ErrInvalid for a bad key or owner or a zero token;
// driver.ErrClosed after Close.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (stop func(), err error) {
	if err := l.check("watch", key, owner); err != nil {
		return nil, err
	}
	if token == 0 || token > math.MaxInt64 {
		return nil, invalid("watch: token %d is not an etcd revision", token)
	}
	ctx, cancel := context.WithCancel(l.base)
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		cancel()
		return nil, fmt.Errorf("etcd: watch: %w", driver.ErrClosed)
	}
	l.bg.Add(1)
	k := l.LockKey(key)
	l.watched[k]++
	l.mu.Unlock()
	w := &holdWatch{l: l, key: key, k: k, owner: owner, rev: int64(token), lost: lost}
	go func() {
		defer l.bg.Done()
		defer l.unwatched(k)
		w.run(ctx)
	}()
	var once sync.Once
	return func() { once.Do(cancel) }, nil
}

// holdWatch is one watched grant.
type holdWatch struct {
	l     *Locker
	key   string // the caller's key
	k     string // the lock key
	owner string
	rev   int64 // the grant's create revision: the token
	lost  func(error)
}

// holdRecheckMax caps the pause between failed re-reads of a grant whose
// watch the server cancelled.
const holdRecheckMax = time.Second

// run watches until the grant is found gone or ctx ends.
func (w *holdWatch) run(ctx context.Context) {
	from := w.rev + 1 // the grant's own put is not news
	for {
		if w.watch(ctx, from) {
			return
		}
		var ok bool
		if from, ok = w.recheck(ctx); !ok {
			return
		}
	}
}

// watch watches the lock key from revision from until the grant is found
// gone (it calls lost and returns true), ctx ends (true), or the server
// cancels the watch (false).
func (w *holdWatch) watch(ctx context.Context, from int64) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for r := range w.l.c.Watch(clientv3.WithRequireLeader(wctx), w.k, clientv3.WithRev(from)) {
		if r.Canceled || r.Err() != nil {
			break
		}
		for _, ev := range r.Events {
			if ev.Type == mvccpb.DELETE && w.l.ownRelease(ctx, w.k, ev.Kv.ModRevision) {
				return true
			}
			if why := w.gone(ev); why != "" {
				w.report(ctx, why, ev.Kv.ModRevision)
				return true
			}
		}
	}
	return ctx.Err() != nil
}

// gone says how ev ended the grant, or "" if it did not.
func (w *holdWatch) gone(ev *clientv3.Event) string {
	switch {
	case ev.Type == mvccpb.DELETE:
		return "lock key deleted (released elsewhere, deleted, or its lease revoked or expired)"
	case ev.Kv.CreateRevision != w.rev:
		return fmt.Sprintf("lock key created again (token %d)", ev.Kv.CreateRevision)
	case string(ev.Kv.Value) != w.owner:
		return "lock key overwritten by another owner"
	}
	return ""
}

// recheck reads the lock key after the server cancelled the watch, retrying
// while the read fails. It returns the revision to watch from, or false if
// the grant is gone (lost was called) or ctx ended.
func (w *holdWatch) recheck(ctx context.Context) (int64, bool) {
	backoff := 10 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, w.l.requestTimeout)
		r, err := w.l.c.Get(rctx, w.k)
		cancel()
		if ctx.Err() != nil {
			return 0, false
		}
		if err == nil {
			switch {
			case len(r.Kvs) == 0:
				w.report(ctx, "lock key not found after the watch was cancelled", r.Header.Revision)
				return 0, false
			case r.Kvs[0].CreateRevision != w.rev || string(r.Kvs[0].Value) != w.owner:
				w.report(ctx, "lock key held by another grant after the watch was cancelled", r.Header.Revision)
				return 0, false
			}
			return r.Header.Revision + 1, true
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, false
		case <-t.C:
		}
		backoff = min(2*backoff, holdRecheckMax)
	}
}

// report calls lost, unless the watch was stopped.
func (w *holdWatch) report(ctx context.Context, why string, rev int64) {
	if ctx.Err() != nil {
		return
	}
	w.lost(fmt.Errorf("etcd: %.100q: %w: %s at revision %d", w.key, driver.ErrNotHeld, why, rev))
}

// releaseLog records the releases of one watched lock key.
type releaseLog struct {
	inflight int
	revs     []int64       // revisions of this Locker's successful deletes
	changed  chan struct{} // closed when a release ends
}

// maxReleaseRevs bounds the revisions kept per watched key.
const maxReleaseRevs = 16

// releaseStarted notes a Release of k in flight, if k is watched; the
// returned function notes its end, with the revision of its delete (0 if
// it deleted nothing).
func (l *Locker) releaseStarted(k string) func(rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watched[k] == 0 {
		return func(int64) {}
	}
	rl := l.releases[k]
	if rl == nil {
		rl = &releaseLog{changed: make(chan struct{})}
		l.releases[k] = rl
	}
	rl.inflight++
	return func(rev int64) {
		l.mu.Lock()
		defer l.mu.Unlock()
		rl.inflight--
		if rev != 0 {
			rl.revs = append(rl.revs, rev)
			if len(rl.revs) > maxReleaseRevs {
				rl.revs = rl.revs[1:]
			}
		}
		close(rl.changed)
		rl.changed = make(chan struct{})
		if rl.inflight == 0 && l.watched[k] == 0 && l.releases[k] == rl {
			delete(l.releases, k)
		}
	}
}

// ownRelease reports whether the delete of k at revision rev was made by
// this Locker's Release, waiting for the Releases of k still in flight
// (the watch event can arrive before the Release's reply). It returns
// false when ctx ends first.
func (l *Locker) ownRelease(ctx context.Context, k string, rev int64) bool {
	for {
		l.mu.Lock()
		rl := l.releases[k]
		if rl == nil {
			l.mu.Unlock()
			return false
		}
		for _, r := range rl.revs {
			if r == rev {
				l.mu.Unlock()
				return true
			}
		}
		if rl.inflight == 0 {
			l.mu.Unlock()
			return false
		}
		ch := rl.changed
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return false
		}
	}
}

// unwatched notes that a hold watch on k ended.
func (l *Locker) unwatched(k string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.watched[k]--; l.watched[k] <= 0 {
		delete(l.watched, k)
		if rl := l.releases[k]; rl != nil && rl.inflight == 0 {
			delete(l.releases, k)
		}
	}
}
