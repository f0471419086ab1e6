package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// Waiting for a shared hold. A waiting request puts one queue entry under
// the lock's "q/" prefix, on a lease of its own (the wait lease, 5s,
// renewed by the wait itself), so the entries form a FIFO queue ordered by
// create revision. The wait then loops: one read of what stands in its way,
// then either the grant transaction or a watch, from the read's revision
// on, for the deletion of the one thing it waits for:
//
//   - a permit or a write waits for the entry just before its own (any
//     mode), and once first in the queue for the deletion of a holder;
//   - a read waits for the latest earlier writer's entry, and once no
//     writer queues before it, for the deletion of the writer's holder key.
//
// So a release wakes only the waiters it can let in (the head of a
// semaphore's queue; the readers behind a writer) and a waiter leaving the
// queue wakes only the one behind it: no thundering herd, no polling.
//
// The grant is one transaction: it deletes the entry and puts the holder
// key on a fresh lease of the hold's TTL, only if the entry still exists at
// its create revision and the holders allow it (holderGuard). A wait whose
// entry is gone (its lease expired while it was cut off) queues again; it
// is never granted on the strength of an entry it no longer has.
//
// A wait that ends without a grant revokes its wait lease, which deletes
// its entry: at once, else in the background until the cluster answers.
// As nothing renews that lease any more, the entry dies with it within
// its 5s even if no revoke ever gets through (after a restart, etcd counts
// a lease's TTL again from the restart). A cancelled wait thus never
// leaves an entry that blocks the lock for good.

// waitSecs is the TTL of a wait lease, in seconds.
func (l *Locker) waitSecs() int64 {
	return max(sessionTTL, int64(l.minTTL/time.Second))
}

// sharedWait is one waiting request.
type sharedWait struct {
	l     *Locker
	sk    *sharedKey
	secs  int64  // the hold's TTL
	wl    *lease // the wait lease; nil while not queued
	me    string // the queue entry; "" while not queued
	myRev int64  // its create revision
	renew time.Time

	// freed says a mutex's wait, first in the queue, saw the lock key go:
	// its next step tries the grant before reading anything.
	freed bool
}

// waitState is what a wait read of the lock.
type waitState struct {
	rev     int64
	held    []*mvccpb.KeyValue // owner's holder key in the mode asked for
	other   bool               // owner holds the RW lock in the other mode
	queued  bool               // the entry exists
	pred    string             // the queue entry waited for, or ""
	holders int64              // the holders in the way
}

// waitRetryMax caps the pause between failed steps of a wait.
const waitRetryMax = time.Second

// waitShared queues sk and waits until it is granted, ctx ends or the
// Locker is closed.
func (l *Locker) waitShared(ctx context.Context, sk *sharedKey, secs int64) (uint64, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(l.base, stop)()
	w := &sharedWait{l: l, sk: sk, secs: secs}
	defer w.dequeue()
	backoff := 10 * time.Millisecond
	for {
		if err := wctx.Err(); err != nil {
			return 0, err
		}
		token, done, err := w.step(wctx)
		if done {
			return token, err
		}
		if err == nil {
			backoff = 10 * time.Millisecond
			continue
		}
		if errors.Is(err, driver.ErrInvalid) || wctx.Err() != nil {
			return 0, err
		}
		// The cluster is unreachable or a watch broke: try again.
		t := time.NewTimer(backoff)
		select {
		case <-wctx.Done():
			t.Stop()
			return 0, err
		case <-t.C:
		}
		backoff = min(2*backoff, waitRetryMax)
	}
}

// step queues the request if needed, reads the lock, and grants it or
// waits for the next change that may let it in. done says the wait is
// over, with token or err.
func (w *sharedWait) step(ctx context.Context) (token uint64, done bool, err error) {
	if w.freed {
		w.freed = false
		if w.me != "" && time.Now().Before(w.renew) {
			if token, ok, err := w.grant(ctx, 0); ok || err != nil {
				return token, ok, err
			}
		}
	}
	var st waitState
	if w.me == "" {
		st, err = w.enqueue(ctx)
	} else {
		if !time.Now().Before(w.renew) && !w.keepQueued(ctx) {
			return 0, false, nil
		}
		st, err = w.read(ctx, nil)
	}
	if err != nil {
		return 0, false, err
	}
	sk := w.sk
	switch {
	case st.held != nil:
		// Granted to the same owner by another call meanwhile: leave the
		// queue and take it as an idempotent acquire.
		w.dequeue()
		cctx, cancel := w.l.opCtx(ctx)
		var token uint64
		if sk.mutex {
			token, err = w.l.acquire(cctx, sk.k, sk.owner, w.secs, "")
		} else {
			token, err = w.l.acquireShared(cctx, sk, w.secs)
		}
		cancel()
		if errors.Is(err, driver.ErrNotAcquired) {
			return 0, false, nil // it ended meanwhile: queue again
		}
		return token, true, err
	case st.other:
		return 0, true, upgradeErr(otherMode(sk.mode), sk.mode)
	case !st.queued:
		w.forget() // its lease expired: queue again
		return 0, false, nil
	case st.pred != "":
		return 0, false, w.block(ctx, st.pred, false, st.rev, func(n int64) bool { return n > 0 })
	case !sk.fits(st.holders):
		err := w.block(ctx, sk.blockingHolders(), sk.holdersRange(), st.rev, func(n int64) bool { return !sk.fits(n) })
		w.freed = err == nil && sk.mutex
		return 0, false, err
	}
	token, ok, err := w.grant(ctx, st.rev)
	return token, ok, err
}

// enqueue puts a new queue entry on a new wait lease, reading the lock in
// the same transaction.
func (w *sharedWait) enqueue(ctx context.Context) (waitState, error) {
	l := w.l
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	le, wait, err := l.freshLease(cctx, l.waitSecs())
	if err != nil {
		return waitState{}, err
	}
	if err := wait(); err != nil {
		l.revokeBG(le.id)
		return waitState{}, err
	}
	st, err := w.read(ctx, le)
	if err != nil {
		l.dropWaitLease(le.id) // the entry may have been put
	}
	return st, err
}

// keepQueued renews the wait lease. It returns false if the lease is gone
// (the entry with it): the wait must queue again.
func (w *sharedWait) keepQueued(ctx context.Context) bool {
	cctx, cancel := w.l.opCtx(ctx)
	defer cancel()
	_, err := w.l.keepAlive(cctx, w.wl)
	switch {
	case err == nil:
		w.renew = time.Now().Add(time.Duration(w.wl.secs) * time.Second / 3)
	case isLeaseNotFound(err):
		w.forget()
		return false
	default:
		w.renew = time.Now().Add(100 * time.Millisecond) // try again soon
	}
	return true
}

// read reads, in one transaction, what decides the wait's next move. With
// enqueue set, the same transaction first puts a new queue entry on that
// lease, and the wait records it.
func (w *sharedWait) read(ctx context.Context, enqueue *lease) (waitState, error) {
	sk := w.sk
	me := w.me
	var ops []clientv3.Op
	pred := append(clientv3.WithLastCreate(), clientv3.WithKeysOnly())
	if enqueue != nil {
		me = sk.entry(enqueue.id)
		ops = append(ops, clientv3.OpPut(me, sk.owner, clientv3.WithLease(enqueue.id)))
		pred = append(pred, clientv3.WithLimit(2)) // the entry itself may come first
	} else {
		pred = append(pred, clientv3.WithMaxCreateRev(w.myRev-1))
	}
	o := len(ops)
	ops = append(ops,
		clientv3.OpGet(sk.k),
		clientv3.OpGet(me, clientv3.WithCountOnly()),
		clientv3.OpGet(sk.blockingQueue(), pred...),
		clientv3.OpGet(sk.blockingHolders(), holdersOpts(sk)...))
	if sk.other != "" {
		ops = append(ops, clientv3.OpGet(sk.other, clientv3.WithCountOnly()))
	}
	cctx, cancel := w.l.opCtx(ctx)
	defer cancel()
	resp, err := w.l.c.Txn(cctx).Then(ops...).Commit()
	if err != nil {
		return waitState{}, err
	}
	if enqueue != nil {
		w.wl, w.me, w.myRev = enqueue, me, resp.Header.Revision
		w.renew = time.Now().Add(time.Duration(enqueue.secs) * time.Second / 3)
	}
	rs := resp.Responses[o:]
	st := waitState{
		rev:     resp.Header.Revision,
		queued:  rs[1].GetResponseRange().GetCount() > 0,
		holders: rs[3].GetResponseRange().GetCount(),
	}
	if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 && (!sk.mutex || string(kvs[0].Value) == sk.owner) {
		st.held = kvs
	}
	for _, kv := range rs[2].GetResponseRange().GetKvs() {
		if string(kv.Key) != me {
			st.pred = string(kv.Key)
			break
		}
	}
	if sk.other != "" {
		st.other = rs[4].GetResponseRange().GetCount() > 0
	}
	return st, nil
}

// holdersOpts are the options of the count of sk's blocking holders.
func holdersOpts(sk *sharedKey) []clientv3.OpOption {
	if sk.holdersRange() {
		return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
	}
	return []clientv3.OpOption{clientv3.WithCountOnly()}
}

// grant makes the grant transaction of a wait that found nothing in its
// way at revision seen. ok is false when the lock changed meanwhile: the
// wait reads it again.
func (w *sharedWait) grant(ctx context.Context, seen int64) (token uint64, ok bool, err error) {
	l, sk := w.l, w.sk
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	le, wait, err := l.freshLease(cctx, w.secs)
	if err != nil {
		return 0, false, err
	}
	conds := append(sk.ownerFree(), clientv3.Compare(clientv3.CreateRevision(w.me), "=", w.myRev))
	if !sk.mutex {
		// For a mutex, ownerFree (the lock key is free) is the guard.
		conds = append(conds, sk.holderGuard(seen))
	}
	resp, err := l.c.Txn(cctx).If(conds...).
		Then(clientv3.OpDelete(w.me), clientv3.OpPut(sk.k, sk.owner, clientv3.WithLease(le.id))).
		Commit()
	kaErr := wait()
	if err != nil {
		l.revokeNow(le.id) // the grant may have happened: undo it
		return 0, false, err
	}
	if !resp.Succeeded {
		if kaErr != nil {
			l.revokeBG(le.id)
		} else {
			l.putSpare(*le)
		}
		return 0, false, nil
	}
	if kaErr != nil {
		// Granted on a reused lease whose renewal failed: it may expire
		// before the TTL promised. Undo the grant and queue again.
		l.revokeBG(le.id)
		w.dequeue()
		return 0, false, kaErr
	}
	rev := resp.Header.Revision
	l.remember(sk.k, holding{owner: sk.owner, rev: rev, lease: *le})
	// The entry went with the grant; the wait lease holds nothing now.
	l.putSpare(*w.wl)
	w.forget()
	return uint64(rev), true, nil
}

// block waits for a deletion of key (of a key under it if prefix is set)
// that may let the request in, renewing the wait lease meanwhile. The lock
// was read at revision rev, and blocked reports whether n keys at key (its
// count) still keep the request out. It returns nil once something was
// deleted or the entry is gone, and an error if the watch broke or ctx
// ended.
//
// The watch starts at the current revision, not at rev+1: etcd serves a
// watch that starts in the past from a loop that runs every 100ms, so on a
// busy lock every wake-up would wait for it. If the lock changed between
// rev and the watch's start, key is counted again, once, to close the gap.
func (w *sharedWait) block(ctx context.Context, key string, prefix bool, rev int64, blocked func(n int64) bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithFilterPut(), clientv3.WithCreatedNotify()}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	wch := w.l.c.Watch(clientv3.WithRequireLeader(wctx), key, opts...)
	created := false
	for {
		t := time.NewTimer(time.Until(w.renew))
		select {
		case r, ok := <-wch:
			t.Stop()
			switch {
			case !ok || r.Canceled || r.Err() != nil:
				if err := ctx.Err(); err != nil {
					return err
				}
				return fmt.Errorf("wait watch on %q broke: %w", key, r.Err())
			case len(r.Events) > 0:
				return nil
			case r.Created && !created:
				created = true
				if r.Header.Revision > rev {
					if still, err := w.stillBlocked(ctx, key, prefix, blocked); err != nil || !still {
						return err
					}
				}
			}
		case <-t.C:
			if !w.keepQueued(ctx) {
				return nil
			}
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// stillBlocked counts the keys at key again.
func (w *sharedWait) stillBlocked(ctx context.Context, key string, prefix bool, blocked func(n int64) bool) (bool, error) {
	opts := []clientv3.OpOption{clientv3.WithCountOnly()}
	if prefix {
		opts = append(opts, clientv3.WithPrefix())
	}
	cctx, cancel := w.l.opCtx(ctx)
	defer cancel()
	r, err := w.l.c.Get(cctx, key, opts...)
	if err != nil {
		return false, err
	}
	return blocked(r.Count), nil
}

// forget drops the wait's record of its entry and wait lease, without
// touching the server.
func (w *sharedWait) forget() { w.wl, w.me, w.myRev = nil, "", 0 }

// dequeue leaves the queue: it revokes the wait lease, which deletes the
// entry.
func (w *sharedWait) dequeue() {
	if w.wl != nil {
		w.l.dropWaitLease(w.wl.id)
	}
	w.forget()
}

// waitRevokeFor bounds the background retries of dropWaitLease; the lease
// expires on its own long before.
const waitRevokeFor = time.Minute

// dropWaitLease revokes a wait lease, deleting its queue entry: at once if
// the cluster answers within revokeNowTimeout, else in the background,
// retrying until it is gone, the Locker is closed or waitRevokeFor passed.
func (l *Locker) dropWaitLease(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeNowTimeout)
	_, err := l.c.Revoke(ctx, id)
	cancel()
	if err == nil || isLeaseNotFound(err) {
		return
	}
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		return // Close cancelled the renewals: the lease expires on its own
	}
	l.bg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.bg.Done()
		end := time.Now().Add(waitRevokeFor)
		backoff := 50 * time.Millisecond
		for time.Now().Before(end) {
			t := time.NewTimer(backoff)
			select {
			case <-l.base.Done():
				t.Stop()
				return
			case <-t.C:
			}
			// Each try is short and fails fast on a member without a
			// leader, so the first to reach a new leader gets through.
			ctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(l.base), min(l.requestTimeout, waitRetryMax))
			_, err := l.c.Revoke(ctx, id)
			cancel()
			if err == nil || isLeaseNotFound(err) {
				return
			}
			backoff = min(2*backoff, waitRetryMax)
		}
	}()
}
