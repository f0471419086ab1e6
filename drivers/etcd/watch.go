package etcd

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// Waiting. Each process (Locker) waiting for a key puts one entry under
// the key's wait prefix, with the Locker's session lease, and the entries
// form a queue ordered by create revision, as in etcd's concurrency.Mutex.
// Only the first entry watches the lock key; every other entry watches the
// entry just before it. So a release wakes one process, which makes one
// Acquire attempt, and when that process leaves the queue (package locker
// ends its subscription once it has no more local waiters) only its
// successor is woken, to watch the lock key in turn: the server sees O(1)
// requests per handoff whatever the number of waiters.
//
// The queue only decides whom to wake; the lock itself is granted only by
// Acquire's transaction, with the waiter's own fresh lease. A waiter whose
// queue entry expired while it waited (the session lease lapsed) is not
// told it holds anything: it re-enqueues and tries Acquire, which succeeds
// only with a live lease.

// sessionTTL is the TTL of the session lease that keeps a Locker's queue
// entries, renewed in the background while the Locker is open. A crashed
// waiter's entry disappears within it, which wakes its successor.
const sessionTTL = 5

// WaitPrefix returns the etcd prefix under which waiters for key queue:
// prefix + "/w/" + len(key) + ":" + key + "/".
func (l *Locker) WaitPrefix(key string) string {
	return l.prefix + "/w/" + strconv.Itoa(len(key)) + ":" + key + "/"
}

// session returns the Locker's session lease, granting it and starting its
// background keepalive if needed.
func (l *Locker) session(ctx context.Context) (clientv3.LeaseID, error) {
	l.sessMu.Lock()
	defer l.sessMu.Unlock()
	if l.sess != clientv3.NoLease {
		select {
		case <-l.sessDone:
		default:
			return l.sess, nil
		}
	}
	r, err := l.c.Grant(ctx, sessionTTL)
	if err != nil {
		return 0, err
	}
	ch, err := l.c.KeepAlive(l.base, r.ID)
	if err != nil {
		l.revokeBG(r.ID)
		return 0, err
	}
	done := make(chan struct{})
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		l.revokeBG(r.ID)
		return 0, fmt.Errorf("session: %w", driver.ErrClosed)
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		defer close(done)
		for range ch {
		}
	}()
	l.sess, l.sessDone = r.ID, done
	return r.ID, nil
}

// Subscribe joins the wait queue of key and returns once the server has
// confirmed the watch that will wake this Locker. The Locker first in the
// queue is woken each time the lock key is deleted (release, expiry of the
// holder's lease, or any delete) and right away if the key is free; the
// others are woken when they become first, which happens when the Locker
// before them ends its subscription or dies (its entry's session lease,
// 5s, lapses). If a watch breaks (lost leader, connection) the driver sends
// one wake-up and watches again. cancel leaves the queue and may be called
// more than once; Close ends every subscription.
//
// Errors: driver.ErrInvalid for a bad key, driver.ErrClosed after Close,
// ctx.Err() (wrapped) when ctx ends before the subscription is confirmed.
func (l *Locker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := l.check("subscribe", key, "-"); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, l.fail(ctx, "subscribe", key, err)
	}
	s := &sub{l: l, lockKey: l.LockKey(key), qpfx: l.WaitPrefix(key), wake: make(chan struct{}, 1), done: make(chan struct{})}
	var wctx context.Context
	wctx, s.cancel = context.WithCancel(l.base)
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	w, err := s.enqueue(cctx, wctx)
	if err != nil {
		s.cancel()
		if s.me != "" {
			l.deleteBG(s.me)
		}
		return nil, nil, l.fail(ctx, "subscribe", key, err)
	}
	go s.loop(wctx, w)
	return s.wake, s.stop, nil
}

// sub is one subscription: a queue entry and the watch that serves it.
type sub struct {
	l       *Locker
	lockKey string
	qpfx    string
	wake    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once

	// Owned by the loop goroutine (and by Subscribe before it starts).
	me    string // our entry
	myRev int64  // its create revision
}

// watching is a watch on one key for deletions.
type watching struct {
	ch      clientv3.WatchChan
	stop    func()
	lockKey bool // watching the lock key (we are first), not a predecessor
}

func (s *sub) send() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sub) stop() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.l.deleteBG(s.me)
	})
}

// enqueue puts a new entry for this subscription and starts watching.
func (s *sub) enqueue(ctx, wctx context.Context) (*watching, error) {
	l := s.l
	sess, err := l.session(ctx)
	if err != nil {
		return nil, err
	}
	me := s.qpfx + fmt.Sprintf("%016x/%d", int64(sess), l.seq.Add(1))
	resp, err := l.c.Txn(ctx).Then(
		clientv3.OpPut(me, "", clientv3.WithLease(sess)),
		clientv3.OpGet(s.qpfx, append(clientv3.WithLastCreate(), clientv3.WithLimit(2), clientv3.WithKeysOnly())...),
		clientv3.OpGet(s.lockKey, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		if isLeaseNotFound(err) {
			l.dropSession(sess)
		}
		return nil, err
	}
	s.me, s.myRev = me, resp.Header.Revision
	pred := ""
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		if string(kv.Key) != me && kv.CreateRevision < s.myRev {
			pred = string(kv.Key)
			break
		}
	}
	free := resp.Responses[2].GetResponseRange().GetCount() == 0
	return s.watchNext(ctx, wctx, pred, free, s.myRev)
}

// recheck looks for the entry before ours after a predecessor went away.
func (s *sub) recheck(ctx, wctx context.Context) (*watching, error) {
	l := s.l
	resp, err := l.c.Txn(ctx).Then(
		clientv3.OpGet(s.qpfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(s.myRev-1), clientv3.WithKeysOnly())...),
		clientv3.OpGet(s.lockKey, clientv3.WithCountOnly()),
		clientv3.OpGet(s.me, clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return nil, err
	}
	if resp.Responses[2].GetResponseRange().GetCount() == 0 {
		// Our entry is gone (the session lease lapsed): queue again.
		l.dropSession(0)
		return s.enqueue(ctx, wctx)
	}
	pred := ""
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		pred = string(kvs[0].Key)
	}
	free := resp.Responses[1].GetResponseRange().GetCount() == 0
	return s.watchNext(ctx, wctx, pred, free, resp.Header.Revision)
}

// watchNext watches pred, or the lock key if pred is empty, for deletions
// after revision rev.
func (s *sub) watchNext(ctx, wctx context.Context, pred string, free bool, rev int64) (*watching, error) {
	key := pred
	if pred == "" {
		key = s.lockKey
	}
	ch, stop, err := s.l.watch(ctx, wctx, key, rev+1)
	if err != nil {
		return nil, err
	}
	if pred == "" && free {
		s.send()
	}
	return &watching{ch: ch, stop: stop, lockKey: pred == ""}, nil
}

// loop serves the subscription until it is cancelled.
func (s *sub) loop(wctx context.Context, w *watching) {
	defer close(s.done)
	backoff := 10 * time.Millisecond
	for {
		broken := true
		for r := range w.ch {
			if r.Canceled || r.Err() != nil {
				break
			}
			if len(r.Events) == 0 {
				continue
			}
			if w.lockKey {
				s.send()
				continue
			}
			broken = false // our predecessor left: look again
			break
		}
		w.stop()
		if wctx.Err() != nil {
			return
		}
		if broken {
			// Anything may have happened while the watch was down.
			s.send()
		}
		for {
			ctx, cancel := context.WithTimeout(wctx, s.l.requestTimeout)
			nw, err := s.recheck(ctx, wctx)
			cancel()
			if err == nil {
				w = nw
				backoff = 10 * time.Millisecond
				break
			}
			if wctx.Err() != nil {
				return
			}
			s.send()
			if !sleepCtx(wctx, backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
		}
	}
}

// watch starts a watch for deletions of k from revision rev, living in
// wctx, and waits, within ctx, for the server to confirm it. stop ends it.
func (l *Locker) watch(ctx, wctx context.Context, k string, rev int64) (wch clientv3.WatchChan, stop func(), err error) {
	return l.startWatch(ctx, wctx, k, clientv3.WithRev(rev), clientv3.WithFilterPut())
}

// startWatch starts a watch of k with opts, living in wctx, and waits,
// within ctx, for the server to confirm it. stop ends it.
func (l *Locker) startWatch(ctx, wctx context.Context, k string, opts ...clientv3.OpOption) (wch clientv3.WatchChan, stop func(), err error) {
	actx, stop := context.WithCancel(wctx)
	wch = l.c.Watch(clientv3.WithRequireLeader(actx), k, append(opts, clientv3.WithCreatedNotify())...)
	select {
	case r, ok := <-wch:
		switch {
		case !ok:
			err = wctx.Err()
			if err == nil {
				err = fmt.Errorf("watch closed before it started")
			}
		case r.Err() != nil:
			err = r.Err()
		case !r.Created:
			err = fmt.Errorf("watch: unexpected first response")
		}
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		stop()
		return nil, nil, err
	}
	return wch, stop, nil
}

// dropSession forgets the session lease (id, or any if id is 0) so that the
// next enqueue grants a new one.
func (l *Locker) dropSession(id clientv3.LeaseID) {
	l.sessMu.Lock()
	defer l.sessMu.Unlock()
	if id == 0 || id == l.sess {
		l.sess = clientv3.NoLease
	}
}

// deleteBG deletes k in the background (Close waits for it).
func (l *Locker) deleteBG(k string) {
	l.goBG(func(ctx context.Context) { _, _ = l.c.Delete(ctx, k) })
}

// sleepCtx waits d; it reports false, at once, if ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
