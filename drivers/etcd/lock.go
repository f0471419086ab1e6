package etcd

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// holding is what this Locker knows of a lock it granted.
type holding struct {
	owner string
	rev   int64 // create revision: the fencing token
	lease lease
}

func (l *Locker) remember(k string, h holding) {
	l.mu.Lock()
	l.held[k] = h
	l.mu.Unlock()
}

// forget drops the record of k if it is for rev (any rev if rev is 0) and
// returns it.
func (l *Locker) forget(k string, rev int64) (holding, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[k]
	if ok && (rev == 0 || h.rev == rev) {
		delete(l.held, k)
		return h, true
	}
	return holding{}, false
}

func (l *Locker) lookup(k string) (holding, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.held[k]
	return h, ok
}

// Acquire makes one attempt to take key for owner: a single transaction
// "if the key's create revision is 0, put owner with a lease of ttl
// (rounded up to whole seconds)", else read the holder. The token is the
// key's create revision, which etcd keeps increasing across the cluster's
// whole history. If owner already holds key, the lease is renewed (replaced
// if ttl changed) and the same token returned.
//
// Errors: driver.ErrNotAcquired if another owner holds key;
// driver.ErrInvalid for an empty or oversized key or owner, or a ttl under
// the minimum; driver.ErrClosed after Close; ctx.Err() (wrapped) when ctx
// ends first. An attempt cut short cleans up only a grant it may have
// created: the lease it put a new lock key on is revoked, but a lock owner
// held before the attempt (through this Locker or another) is never
// revoked or deleted, even when the attempt was moving it to a lease of a
// new TTL (TestCutAcquireKeepsPriorHold).
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := l.check("acquire", key, owner); err != nil {
		return 0, err
	}
	secs, err := l.ttlSeconds("acquire", ttl)
	if err != nil {
		return 0, err
	}
	var token uint64
	err = l.withPushback(ctx, l.acquireTurns, func(cctx context.Context) (err error) {
		token, err = l.acquire(cctx, l.LockKey(key), owner, secs, "")
		return err
	})
	if err != nil {
		return 0, l.fail(ctx, "acquire", key, err)
	}
	return token, nil
}

// acquire is Acquire on the etcd key k. It retries at most a few times when
// the state it saw changed under it (a reused lease or the holder's lease
// expired). With queue set, k is granted only if no key lies under that
// prefix (no waiter queues): errBlocked otherwise.
func (l *Locker) acquire(ctx context.Context, k, owner string, secs int64, queue string) (uint64, error) {
	var lastErr error
	for range 3 {
		token, retry, err := l.tryAcquire(ctx, k, owner, secs, queue)
		if !retry {
			return token, err
		}
		lastErr = err
	}
	return 0, lastErr
}

// tryAcquire makes one Acquire transaction on k with a fresh lease. retry
// says whether the state it saw changed under it, so that another attempt
// may succeed. queue is as for acquire.
func (l *Locker) tryAcquire(ctx context.Context, k, owner string, secs int64, queue string) (token uint64, retry bool, err error) {
	le, wait, err := l.freshLease(ctx, secs)
	if err != nil {
		return 0, false, err
	}
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)}
	if queue != "" {
		conds = append(conds, clientv3.Compare(clientv3.CreateRevision(queue), "=", 0).WithPrefix())
	}
	resp, err := l.c.Txn(ctx).
		If(conds...).
		Then(clientv3.OpPut(k, owner, clientv3.WithLease(le.id))).
		Else(clientv3.OpGet(k)).
		Commit()
	kaErr := wait()
	if err != nil && tooManyRequests(err) && kaErr == nil {
		// Refused before it was proposed: the lease holds nothing.
		l.putSpare(*le)
		return 0, false, err
	}
	if err != nil {
		// Whether or not the put happened, the key lives only as long
		// as the lease: revoking it leaves nothing behind.
		l.revokeNow(le.id)
		if isLeaseNotFound(err) && ctx.Err() == nil {
			return 0, true, err // a reused lease had expired
		}
		return 0, false, err
	}
	if resp.Succeeded {
		if kaErr != nil {
			// The key is ours but the reused lease's renewal is
			// unconfirmed: it may expire before the TTL promised.
			l.revokeBG(le.id)
			return 0, isLeaseNotFound(kaErr) && ctx.Err() == nil, kaErr
		}
		rev := resp.Header.Revision
		l.remember(k, holding{owner: owner, rev: rev, lease: *le})
		return uint64(rev), false, nil
	}
	if kaErr != nil {
		l.revokeBG(le.id)
		le = nil // unusable: its renewal failed
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 && queue != "" {
		// k is free, but others queue for it.
		if le != nil {
			l.putSpare(*le)
		}
		return 0, false, errBlocked
	}
	token, retry, used, err := l.acquireHeld(ctx, k, owner, secs, resp.Responses[0].GetResponseRange().GetKvs(), le, kaErr)
	if le != nil && !used {
		l.putSpare(*le)
	}
	return token, retry, err
}

// acquireHeld finishes an Acquire whose transaction found k held; kvs is
// k as the transaction read it. If owner holds k, its lease is renewed, or
// k is moved to le, the fresh lease of the TTL asked (nil if its renewal
// failed with kaErr). used reports whether le was taken (it then holds k,
// or may, and must not be reused).
func (l *Locker) acquireHeld(ctx context.Context, k, owner string, secs int64, kvs []*mvccpb.KeyValue, le *lease, kaErr error) (token uint64, retry, used bool, err error) {
	if len(kvs) == 0 {
		return 0, true, false, errors.New("lock key vanished inside a transaction")
	}
	kv := kvs[0]
	if string(kv.Value) != owner {
		return 0, false, false, driver.ErrNotAcquired
	}
	// Idempotent acquire: owner holds k already. Renew its lease, or move
	// the key to a lease of the new TTL.
	cur := lease{id: clientv3.LeaseID(kv.Lease), secs: secs}
	if h, ok := l.lookup(k); ok && h.rev == kv.CreateRevision && h.lease.id == cur.id {
		cur = h.lease
	}
	granted, err := l.keepAlive(ctx, &cur)
	if err != nil {
		// An expired lease (it expired just now): try again.
		return 0, isLeaseNotFound(err) && ctx.Err() == nil, false, err
	}
	if granted == secs {
		l.remember(k, holding{owner: owner, rev: kv.CreateRevision, lease: cur})
		return uint64(kv.CreateRevision), false, false, nil
	}
	if le == nil {
		return 0, true, false, kaErr
	}
	moved, err := l.moveLease(ctx, k, owner, kv.CreateRevision, *le)
	if err != nil {
		// The key may or may not be on le now. It was held by owner
		// before this attempt (through this Locker or another), so it
		// must not be revoked: le is left to expire on its own, holding
		// at most that key, for the TTL asked.
		return 0, false, true, err
	}
	if !moved {
		return 0, true, false, errors.New("lock changed while moving it to a new lease")
	}
	l.revokeBG(cur.id)
	l.remember(k, holding{owner: owner, rev: kv.CreateRevision, lease: *le})
	return uint64(kv.CreateRevision), false, true, nil
}

// moveLease attaches k to le if k is still the incarnation rev held by owner.
func (l *Locker) moveLease(ctx context.Context, k, owner string, rev int64, le lease) (bool, error) {
	resp, err := l.c.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", rev),
			clientv3.Compare(clientv3.Value(k), "=", owner)).
		Then(clientv3.OpPut(k, owner, clientv3.WithLease(le.id))).
		Commit()
	if err != nil {
		return false, err
	}
	return resp.Succeeded, nil
}

// Refresh renews the lease of the lock owner holds on key: a linearizable
// read of the key, then a lease keepalive, which resets the TTL to the
// lease's TTL. If ttl (rounded up to whole seconds) differs from it, the key
// is moved to a new lease of ttl. An expired lease cannot be renewed, so an
// expired lock is never revived.
//
// Errors: driver.ErrNotHeld if owner does not hold key; driver.ErrInvalid,
// driver.ErrClosed and ctx.Err() as for Acquire.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := l.check("refresh", key, owner); err != nil {
		return err
	}
	secs, err := l.ttlSeconds("refresh", ttl)
	if err != nil {
		return err
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	if err := l.refresh(cctx, l.LockKey(key), owner, secs); err != nil {
		return l.fail(ctx, "refresh", key, err)
	}
	return nil
}

func (l *Locker) refresh(ctx context.Context, k, owner string, secs int64) error {
	if done, err := l.refreshKnown(ctx, k, owner, secs); done {
		return err
	}
	kv, err := l.readKey(ctx, k)
	if err != nil {
		return err
	}
	if kv == nil || string(kv.Value) != owner {
		l.forget(k, 0)
		return driver.ErrNotHeld
	}
	cur := lease{id: clientv3.LeaseID(kv.Lease), secs: secs}
	if h, ok := l.lookup(k); ok && h.rev == kv.CreateRevision && h.lease.id == cur.id {
		cur = h.lease
	}
	granted, err := l.keepAlive(ctx, &cur)
	if err != nil {
		if isLeaseNotFound(err) {
			l.forget(k, kv.CreateRevision)
			return driver.ErrNotHeld
		}
		return err
	}
	if granted != secs {
		le, wait, err := l.freshLease(ctx, secs)
		if err != nil {
			return err
		}
		if err := wait(); err != nil {
			l.revokeBG(le.id)
			return err
		}
		moved, err := l.moveLease(ctx, k, owner, kv.CreateRevision, *le)
		if err != nil {
			// The key may be on le now: le is left to expire on its
			// own rather than revoked with the lock.
			return err
		}
		if !moved {
			l.revokeBG(le.id)
			return driver.ErrNotHeld
		}
		l.revokeBG(cur.id)
		cur = *le
	}
	l.remember(k, holding{owner: owner, rev: kv.CreateRevision, lease: cur})
	return nil
}

// refreshKnown is Refresh of a lock this Locker granted to owner with a
// lease of secs: the lease is known, so its keepalive goes out together
// with the owner check instead of after it, which halves a renewal's
// latency on a loaded cluster. done is false when the answers leave
// anything in doubt (another incarnation, a moved lease, a broken
// stream); refresh then takes the longer path.
func (l *Locker) refreshKnown(ctx context.Context, k, owner string, secs int64) (done bool, err error) {
	h, ok := l.lookup(k)
	if !ok || h.owner != owner || h.lease.secs != secs {
		return false, nil
	}
	sent := time.Now()
	p := l.sendRenew(h.lease.id)
	kv, err := l.readKey(ctx, k)
	ttl, kaErr := awaitRenew(ctx, p)
	switch {
	case err != nil:
		return true, err
	case kv == nil || string(kv.Value) != owner:
		l.forget(k, 0)
		return true, driver.ErrNotHeld
	case kv.CreateRevision != h.rev || clientv3.LeaseID(kv.Lease) != h.lease.id:
		return false, nil
	case isLeaseNotFound(kaErr):
		l.forget(k, h.rev)
		return true, driver.ErrNotHeld
	case kaErr != nil && ctx.Err() != nil:
		return true, kaErr
	case kaErr != nil || ttl != secs:
		return false, nil
	}
	h.lease.expires = sent.Add(time.Duration(secs) * time.Second)
	l.remember(k, h)
	return true, nil
}

// Release deletes key if owner holds it, in one transaction. When this
// Locker granted the lock, the transaction compares the key's create
// revision with the token it granted as well as its value with owner, so a
// stale or retried Release cannot delete a newer incarnation of the lock
// granted elsewhere to the same owner (etcd #22082); otherwise it compares
// the value with owner. The lease is kept for reuse by a later Acquire.
//
// Errors: driver.ErrNotHeld if owner does not hold key (nothing is
// changed); driver.ErrInvalid, driver.ErrClosed and ctx.Err() as for
// Acquire.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	if err := l.check("release", key, owner); err != nil {
		return err
	}
	k := l.LockKey(key)
	if err := l.withPushback(ctx, l.releaseTurns, func(cctx context.Context) error { return l.release(cctx, k, owner) }); err != nil {
		return l.fail(ctx, "release", key, err)
	}
	return nil
}

func (l *Locker) release(ctx context.Context, k, owner string) (err error) {
	var rev int64 // the revision of the delete, once it succeeded
	end := l.releaseStarted(k)
	defer func() { end(rev) }()
	if h, ok := l.lookup(k); ok && h.owner == owner {
		resp, err := l.c.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", h.rev),
				clientv3.Compare(clientv3.Value(k), "=", owner)).
			Then(clientv3.OpDelete(k)).
			Commit()
		if err != nil {
			return err
		}
		if resp.Succeeded {
			rev = resp.Header.Revision
			if h, ok := l.forget(k, h.rev); ok {
				l.putSpare(h.lease)
			}
			return nil
		}
		// Not the incarnation this Locker granted to owner (that one
		// expired or was deleted): leave a newer one alone (etcd #22082).
		l.forget(k, h.rev)
		return driver.ErrNotHeld
	}
	resp, err := l.c.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(k), "=", owner)).
		Then(clientv3.OpDelete(k, clientv3.WithPrevKV())).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return driver.ErrNotHeld
	}
	rev = resp.Header.Revision
	if d := resp.Responses[0].GetResponseDeleteRange(); d != nil && len(d.PrevKvs) == 1 {
		l.revokeBG(clientv3.LeaseID(d.PrevKvs[0].Lease))
	}
	return nil
}

// Inspect reports the holder of key: its owner, token (create revision)
// and remaining TTL. etcd reports lease TTLs in whole seconds rounded down,
// so Remaining is a whole number of seconds, or 1ms when less than a second
// is left or the lease has expired and the server is about to delete the
// key. It makes two requests (a read and a lease TimeToLive) and changes
// nothing; where a change watch of this Locker (WatchChanges) reported the
// grant it finds less than 100ms earlier, it takes the TimeToLive the
// watch started then instead of making its own, so Remaining may be that
// much older.
//
// Errors: driver.ErrNotHeld if key is free; driver.ErrInvalid for a bad
// key; driver.ErrClosed and ctx.Err() as for Acquire.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := l.check("inspect", key, "-"); err != nil {
		return driver.Info{}, err
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	k := l.LockKey(key)
	r, err := l.c.Get(cctx, k)
	if err != nil {
		return driver.Info{}, l.fail(ctx, "inspect", key, err)
	}
	if len(r.Kvs) == 0 {
		return driver.Info{}, l.fail(ctx, "inspect", key, driver.ErrNotHeld)
	}
	kv := r.Kvs[0]
	info := driver.Info{Owner: string(kv.Value), Token: uint64(kv.CreateRevision)}
	if kv.Lease == 0 {
		return info, nil // not written by this driver: no expiry
	}
	secs, ok := l.takeTTL(cctx, clientv3.LeaseID(kv.Lease))
	if !ok {
		t, err := l.c.TimeToLive(cctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			return driver.Info{}, l.fail(ctx, "inspect", key, err)
		}
		secs = t.TTL
	}
	info.Remaining = max(time.Duration(secs)*time.Second, time.Millisecond)
	return info, nil
}
