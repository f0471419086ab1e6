package etcd

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// Shared holds (driver.SharedLocker): semaphores and read-write locks. See
// the package documentation, "Semaphores and read-write locks", for the
// design and why; sharedwait.go for waiting.

var _ driver.SharedLocker = (*Locker)(nil)

// sharedKey names the etcd keys of one shared request: the lock's base
// prefix and the ranges and keys under it.
type sharedKey struct {
	key   string // the caller's key, for errors
	base  string // prefix + "/s/" or "/rw/" + len(key) + ":" + key + "/"
	mode  driver.SharedMode
	owner string
	limit int
	k     string // owner's holder key in mode
	other string // owner's holder key in the other mode of an RW lock, or ""

	// mutex says this is a mutex's waiting Acquire (mutexwait.go): k is
	// the lock key, held by owner only if its value is owner, and base is
	// the queue itself.
	mutex bool
}

// modeLetter is the segment naming a mode in holder and queue keys.
func modeLetter(m driver.SharedMode) string {
	switch m {
	case driver.SharedRead:
		return "r"
	case driver.SharedWrite:
		return "w"
	}
	return "p"
}

// SharedPrefix returns the etcd prefix under which the shared lock mode
// names on key keeps its holders and waiters: prefix + "/s/" (a semaphore)
// or prefix + "/rw/" (a read-write lock) + len(key) + ":" + key + "/".
// Holders are the keys under it + "h/" + "p", "r" or "w" + "/" + owner,
// waiters those under it + "q/".
func (l *Locker) SharedPrefix(key string, mode driver.SharedMode) string {
	ns := "/s/"
	if mode.RW() {
		ns = "/rw/"
	}
	return l.prefix + ns + strconv.Itoa(len(key)) + ":" + key + "/"
}

func (l *Locker) sharedKeyOf(key string, req driver.SharedRequest) *sharedKey {
	sk := &sharedKey{key: key, base: l.SharedPrefix(key, req.Mode), mode: req.Mode, owner: req.Owner, limit: req.Limit}
	sk.k = sk.holder(req.Mode)
	switch req.Mode {
	case driver.SharedRead:
		sk.other = sk.holder(driver.SharedWrite)
	case driver.SharedWrite:
		sk.other = sk.holder(driver.SharedRead)
	}
	return sk
}

func (sk *sharedKey) holder(m driver.SharedMode) string {
	return sk.base + "h/" + modeLetter(m) + "/" + sk.owner
}

// holders is the prefix of every holder key.
func (sk *sharedKey) holders() string { return sk.base + "h/" }

// queue is the prefix of every queue entry.
func (sk *sharedKey) queue() string {
	if sk.mutex {
		return sk.base
	}
	return sk.base + "q/"
}

// entry is the queue entry of a wait on the wait lease id.
func (sk *sharedKey) entry(id clientv3.LeaseID) string {
	if sk.mutex {
		return sk.queue() + fmt.Sprintf("%016x", int64(id))
	}
	return sk.queue() + modeLetter(sk.mode) + "/" + fmt.Sprintf("%016x", int64(id))
}

// blockingHolders is the prefix of the holders that keep this request out:
// the writer for a read, every holder for a permit or a write; for a
// mutex, the lock key itself (not a prefix: see holdersRange).
func (sk *sharedKey) blockingHolders() string {
	if sk.mutex {
		return sk.k
	}
	if sk.mode == driver.SharedRead {
		return sk.base + "h/w/"
	}
	return sk.holders()
}

// blockingQueue is the prefix of the waiters that go before a new request:
// the waiting writers for a read, every waiter for a permit or a write.
func (sk *sharedKey) blockingQueue() string {
	if sk.mode == driver.SharedRead {
		return sk.base + "q/w/"
	}
	return sk.queue()
}

// holderGuard is the compare that admits a grant beside the holders: for
// a permit, no holder key created after revision seen (when seen holders
// were counted, fewer than the limit: the count cannot have grown); for a
// read, no writer; for a write, no holder at all.
func (sk *sharedKey) holderGuard(seen int64) clientv3.Cmp {
	if sk.mode == driver.SharedPermit {
		return clientv3.Compare(clientv3.CreateRevision(sk.holders()), "<", seen+1).WithPrefix()
	}
	return clientv3.Compare(clientv3.CreateRevision(sk.blockingHolders()), "=", 0).WithPrefix()
}

// holdersRange says blockingHolders is a prefix, not one key.
func (sk *sharedKey) holdersRange() bool { return !sk.mutex }

// ownerFree are the compares that owner holds no hold of this lock yet.
func (sk *sharedKey) ownerFree() []clientv3.Cmp {
	cs := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(sk.k), "=", 0)}
	if sk.other != "" {
		cs = append(cs, clientv3.Compare(clientv3.CreateRevision(sk.other), "=", 0))
	}
	return cs
}

// fits reports whether n blocking holders leave room for this request.
func (sk *sharedKey) fits(n int64) bool {
	if sk.mode == driver.SharedPermit {
		return n < int64(sk.limit)
	}
	return n == 0
}

func checkMode(mode driver.SharedMode) error {
	if err := driver.CheckMode(mode); err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	return nil
}

func upgradeErr(held, want driver.SharedMode) error {
	return fmt.Errorf("%w: the owner holds the %s lock and asks for the %s lock; "+
		"there are no upgrades or downgrades: release it first", driver.ErrInvalid, held, want)
}

// errBlocked says a request cannot be granted now: holders or earlier
// waiters are in its way.
var errBlocked = fmt.Errorf("%w: held, or waited for, by others", driver.ErrNotAcquired)

// AcquireShared implements driver.SharedLocker. A request is one
// transaction when nothing is in its way: it puts owner's holder key, with
// a lease of its own of req.TTL (rounded up to whole seconds), only if the
// holders and waiters it must respect are as the compares say; a refused
// request writes nothing. A permit beside other holders costs a second
// transaction: the first counts them, the second grants only if no holder
// key was created since. A waiting request queues (see sharedwait.go). The
// token is the holder key's create revision.
//
// Errors: driver.ErrNotAcquired without req.Wait when the hold cannot be
// granted now; driver.ErrInvalid for a bad key, owner, mode, limit or ttl,
// or when owner holds the read-write lock in the other mode;
// driver.ErrClosed after Close; ctx.Err() (wrapped) when ctx ends first,
// leaving nothing held or queued.
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if err := l.check("acquire shared", key, req.Owner); err != nil {
		return 0, err
	}
	if err := checkMode(req.Mode); err != nil {
		return 0, err
	}
	if err := driver.CheckLimit(req); err != nil {
		return 0, fmt.Errorf("etcd: %w", err)
	}
	secs, err := l.ttlSeconds("acquire shared", req.TTL)
	if err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, l.fail(ctx, "acquire "+req.Mode.String(), key, err)
	}
	sk := l.sharedKeyOf(key, req)
	cctx, cancel := l.opCtx(ctx)
	token, err := l.acquireShared(cctx, sk, secs)
	cancel()
	if err == errBlocked && req.Wait {
		token, err = l.waitShared(ctx, sk, secs)
	}
	if err != nil {
		return 0, l.fail(ctx, "acquire "+req.Mode.String(), key, err)
	}
	return token, nil
}

// acquireShared makes the one-shot attempts of a request: errBlocked when
// holders or waiters are in its way.
func (l *Locker) acquireShared(ctx context.Context, sk *sharedKey, secs int64) (uint64, error) {
	var seen int64 // see holderGuard; 0: no holder at all
	var lastErr error
	for range 8 {
		token, again, err := l.trySharedOnce(ctx, sk, secs, &seen)
		if !again {
			return token, err
		}
		lastErr = err
	}
	return 0, lastErr
}

// trySharedOnce makes one grant transaction for sk with a fresh lease.
// again says another attempt may succeed: the state changed under it, or
// a permit found fewer holders than its limit (seen is then their
// revision).
func (l *Locker) trySharedOnce(ctx context.Context, sk *sharedKey, secs int64, seen *int64) (token uint64, again bool, err error) {
	le, wait, err := l.freshLease(ctx, secs)
	if err != nil {
		return 0, false, err
	}
	conds := append(sk.ownerFree(),
		clientv3.Compare(clientv3.CreateRevision(sk.blockingQueue()), "=", 0).WithPrefix(),
		sk.holderGuard(*seen))
	elseOps := []clientv3.Op{
		clientv3.OpGet(sk.k),
		clientv3.OpGet(sk.blockingHolders(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(sk.blockingQueue(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	}
	if sk.other != "" {
		elseOps = append(elseOps, clientv3.OpGet(sk.other, clientv3.WithCountOnly()))
	}
	resp, err := l.c.Txn(ctx).If(conds...).
		Then(clientv3.OpPut(sk.k, sk.owner, clientv3.WithLease(le.id))).
		Else(elseOps...).Commit()
	kaErr := wait()
	if err != nil {
		l.revokeNow(le.id) // the put may have happened: undo it with its lease
		return 0, isLeaseNotFound(err) && ctx.Err() == nil, err
	}
	if resp.Succeeded {
		if kaErr != nil {
			l.revokeBG(le.id)
			return 0, isLeaseNotFound(kaErr) && ctx.Err() == nil, kaErr
		}
		rev := resp.Header.Revision
		l.remember(sk.k, holding{owner: sk.owner, rev: rev, lease: *le})
		return uint64(rev), false, nil
	}
	if kaErr != nil {
		l.revokeBG(le.id)
		le = nil
	}
	rs := resp.Responses
	if kvs := rs[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
		// Idempotent acquire: owner holds this hold already.
		token, retry, used, err := l.acquireHeld(ctx, sk.k, sk.owner, secs, kvs, le, kaErr)
		if le != nil && !used {
			l.putSpare(*le)
		}
		return token, retry, err
	}
	if le != nil {
		l.putSpare(*le)
	}
	if sk.other != "" && rs[3].GetResponseRange().GetCount() > 0 {
		return 0, false, upgradeErr(otherMode(sk.mode), sk.mode)
	}
	if rs[2].GetResponseRange().GetCount() > 0 || !sk.fits(rs[1].GetResponseRange().GetCount()) {
		return 0, false, errBlocked
	}
	// A permit with room beside the holders counted at this revision.
	*seen = resp.Header.Revision
	return 0, true, errBlocked
}

func otherMode(m driver.SharedMode) driver.SharedMode {
	if m == driver.SharedRead {
		return driver.SharedWrite
	}
	return driver.SharedRead
}

// sharedHold returns the holder key of owner's hold of key in mode, after
// checking the arguments.
func (l *Locker) sharedHold(op, key string, mode driver.SharedMode, owner string) (string, error) {
	if err := l.check(op, key, owner); err != nil {
		return "", err
	}
	if err := checkMode(mode); err != nil {
		return "", err
	}
	return l.sharedKeyOf(key, driver.SharedRequest{Mode: mode, Owner: owner}).k, nil
}

// RefreshShared implements driver.SharedLocker as Refresh does for a lock:
// a read of the holder key and a keepalive of its lease (the key moves to
// a new lease if ttl changed). An expired hold is never revived.
//
// Errors: driver.ErrNotHeld if owner does not hold key in mode;
// driver.ErrInvalid, driver.ErrClosed and ctx.Err() as for AcquireShared.
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	k, err := l.sharedHold("refresh shared", key, mode, owner)
	if err != nil {
		return err
	}
	secs, err := l.ttlSeconds("refresh shared", ttl)
	if err != nil {
		return err
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	if err := l.refresh(cctx, k, owner, secs); err != nil {
		return l.fail(ctx, "refresh "+mode.String(), key, err)
	}
	return nil
}

// ReleaseShared implements driver.SharedLocker as Release does for a lock:
// one transaction deletes the holder key if it is the grant this Locker
// made (or, for a grant made elsewhere, any grant to owner). The deletion
// wakes the waiters it lets in.
//
// Errors: driver.ErrNotHeld if owner does not hold key in mode (nothing is
// changed); driver.ErrInvalid, driver.ErrClosed and ctx.Err() as for
// AcquireShared.
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	k, err := l.sharedHold("release shared", key, mode, owner)
	if err != nil {
		return err
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	if err := l.release(cctx, k, owner); err != nil {
		return l.fail(ctx, "release "+mode.String(), key, err)
	}
	return nil
}

// InspectShared implements driver.SharedLocker: one read of the holder
// keys, then one lease TimeToLive per holder, in parallel. Remaining is in
// whole seconds rounded down, or 1ms, as for Inspect.
//
// Errors: driver.ErrInvalid for a bad key or mode; driver.ErrClosed and
// ctx.Err() as for AcquireShared.
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := l.check("inspect shared", key, "-"); err != nil {
		return nil, err
	}
	if err := checkMode(mode); err != nil {
		return nil, err
	}
	cctx, cancel := l.opCtx(ctx)
	defer cancel()
	pfx := l.SharedPrefix(key, mode) + "h/"
	r, err := l.c.Get(cctx, pfx, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, l.fail(ctx, "inspect shared", key, err)
	}
	out := make([]driver.SharedInfo, len(r.Kvs))
	errs := make([]error, len(r.Kvs))
	var wg sync.WaitGroup
	for i, kv := range r.Kvs {
		out[i] = driver.SharedInfo{
			Info: driver.Info{Owner: string(kv.Value), Token: uint64(kv.CreateRevision)},
			Mode: holderMode(kv, len(pfx)),
		}
		if kv.Lease == 0 {
			continue
		}
		wg.Go(func() {
			t, err := l.c.TimeToLive(cctx, clientv3.LeaseID(kv.Lease))
			if err != nil {
				errs[i] = err
				return
			}
			out[i].Remaining = max(time.Duration(t.TTL)*time.Second, time.Millisecond)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, l.fail(ctx, "inspect shared", key, err)
		}
	}
	return out, nil
}

// holderMode reads the mode of a holder key from the letter at offset at.
func holderMode(kv *mvccpb.KeyValue, at int) driver.SharedMode {
	if len(kv.Key) > at {
		switch kv.Key[at] {
		case 'r':
			return driver.SharedRead
		case 'w':
			return driver.SharedWrite
		}
	}
	return driver.SharedPermit
}
