package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5"
)

// sharedLeaseID is the id of the shared lock mode names on key in the
// shared table: the first 16 bytes of its sharedSum, so a semaphore and a
// read-write lock on one key are two rows, and their ids never equal a
// lease table id (another hash function), which keeps the NOTIFY payloads
// of the mutex and of the shared locks apart.
func sharedLeaseID(ns string, mode driver.SharedMode, key string) []byte {
	return sharedSum(ns, sharedKind(mode), key)[:16]
}

// acquireShared is AcquireShared in lease mode; the request is valid.
func (l *leaseLocker) acquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	id := sharedLeaseID(l.ns, req.Mode, key)
	if !req.Wait {
		tok, _, err := l.tryShared(ctx, key, id, req)
		return tok, err
	}
	return l.waitShared(ctx, key, id, req)
}

// tryShared runs the acquire statement once (again on a fresh connection
// where the pooled one is broken). A grant whose reply arrives once ctx is
// done is undone; cut reports a statement ctx cut short, whose outcome is
// unknown.
func (l *leaseLocker) tryShared(ctx context.Context, key string, id []byte, req driver.SharedRequest) (tok uint64, cut bool, err error) {
	ms, _ := ttlMillis(req.TTL)
	qctx, qcancel := outlive(ctx, cancelGrace)
	defer qcancel()
	for tries := 0; ; tries++ {
		var t, rem *int64
		var conflict, first bool
		err := l.pool.QueryRow(qctx, l.shsql.acquire, l.args(id, []byte(key), []byte(req.Owner), int32(req.Mode),
			int32(req.Limit), ms, req.Wait)...).Scan(&t, &rem, &conflict, &first, new(string))
		switch {
		case err == nil && conflict:
			return 0, false, fmt.Errorf("postgres: acquire %q: owner holds the other side of the read-write lock (no upgrades or downgrades: release it first): %w", key, driver.ErrInvalid)
		case err == nil && t != nil && ctx.Err() != nil:
			l.undoShared(qctx, id, req.Owner, req.Mode, 0)
			return 0, false, l.fail(ctx, "acquire", ctx.Err())
		case err == nil && t != nil:
			return uint64(*t), false, nil
		case err == nil:
			var r time.Duration
			if rem != nil && *rem > 0 {
				r = time.Duration(*rem) * time.Millisecond
			}
			if first {
				return 0, false, firstInQueue{&driver.HeldError{Remaining: r}}
			}
			if req.Wait {
				return 0, false, behindInQueue{&driver.HeldError{Remaining: r}}
			}
			return 0, false, &driver.HeldError{Remaining: r}
		case retryable(err) && ctx.Err() == nil && tries < l.retries:
			continue
		}
		return 0, ctx.Err() != nil, l.fail(ctx, "acquire", sqlError(unavailable(err)))
	}
}

// firstInQueue is the refusal of a waiting request that is first in its
// lock's queue: only holders are in its way, and every waiter behind it
// waits for its grant. Without notifications (through a pooler) it retries
// at most leaseHeadWaitMax apart.
type firstInQueue struct{ *driver.HeldError }

func (e firstInQueue) Unwrap() error { return e.HeldError }

// behindInQueue is the refusal of a waiting request that has waiters ahead
// of it in its lock's queue. With notifications it does not retry at the
// holders' expiry: the first waiter does, and its acquire wakes the
// waiters it then lets in.
type behindInQueue struct{ *driver.HeldError }

func (e behindInQueue) Unwrap() error { return e.HeldError }

// undoShared removes owner's hold in each of modes (0: its queue entry),
// one statement each, which wakes the waiters it lets in. It is bounded by
// ctx.
func (l *leaseLocker) undoShared(ctx context.Context, id []byte, owner string, modes ...driver.SharedMode) {
	for _, m := range modes {
		_ = l.pool.QueryRow(ctx, l.shsql.release, l.args(id, []byte(owner), int32(m))...).Scan(new(bool), new(*string))
	}
}

// waitShared is a waiting AcquireShared in lease mode, on the schedule of
// the mutex's waits (see Locker.AcquireWait), except that a release of the
// lock notifies only the waiters it lets in (see sharedWakePayload), and
// only the first waiter retries just after the holders' earliest remaining
// TTL (its acquire wakes the others it lets in); every waiter retries at
// the latest after leaseWaitFallback. The waiter's queue entry, which holds back the
// requests that arrive after it, is renewed by each attempt. A wait that
// ends without a grant removes its entry and a grant whose outcome it could
// not learn, in one clean-up bounded by cancelGrace.
func (l *leaseLocker) waitShared(ctx context.Context, key string, id []byte, req driver.SharedRequest) (uint64, error) {
	var cut bool
	attempt := func() (uint64, error) {
		tok, c, err := l.tryShared(ctx, key, id, req)
		cut = c
		return tok, err
	}
	sub := func(ctx context.Context) (<-chan struct{}, func(), error) {
		return l.subscribeShared(ctx, id, req.Owner)
	}
	return l.waitFor(ctx, sub, attempt, func(inAttempt bool) { l.endSharedWait(id, req, inAttempt && cut) })
}

// endSharedWait cleans up after a wait that ends without a grant: it drops
// its queue entry (one statement), and a hold a statement cut short may
// have granted (a second).
func (l *leaseLocker) endSharedWait(id []byte, req driver.SharedRequest, cut bool) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if cut {
		l.undoShared(ctx, id, req.Owner, req.Mode, 0)
		return
	}
	l.undoShared(ctx, id, req.Owner, 0)
}

// refreshShared is RefreshShared in lease mode; the arguments are valid.
func (l *leaseLocker) refreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	ms, _ := ttlMillis(ttl)
	return l.changeShared(ctx, "refresh", key, mode, owner, ms)
}

// releaseShared is ReleaseShared in lease mode; the arguments are valid.
func (l *leaseLocker) releaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	return l.changeShared(ctx, "release", key, mode, owner)
}

// changeShared runs the refresh or the release statement (op) on owner's
// hold of key in mode, with the refresh's TTL in ms as ttl; again on a fresh connection where the pooled one is broken (both are
// owner-checked, so running one again is safe). A hold not found is
// driver.ErrNotHeld.
func (l *leaseLocker) changeShared(ctx context.Context, op, key string, mode driver.SharedMode, owner string, ttl ...any) error {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	sql := l.shsql.release
	if op == "refresh" {
		sql = l.shsql.refresh
	}
	id := sharedLeaseID(l.ns, mode, key)
	args := l.args(append([]any{id, []byte(owner), int32(mode)}, ttl...)...)
	var found bool
	for tries := 0; ; tries++ {
		err = l.pool.QueryRow(ctx, sql, args...).Scan(&found, new(*string))
		if err == nil || !retryable(err) || ctx.Err() != nil || tries >= l.retries {
			break
		}
	}
	switch {
	case err == nil && found:
		return nil
	case err == nil:
		return notHeld(op, key)
	}
	return l.fail(ctx, op, sqlError(unavailable(err)))
}

// sweepShared deletes the rows of the shared table whose holders and
// writer entries all expired longer than age ago, and returns how many.
func (l *leaseLocker) sweepShared(ctx context.Context, age time.Duration) (int64, error) {
	tag, err := l.pool.Exec(ctx, l.shsql.sweep, l.args(age.Milliseconds())...)
	return tag.RowsAffected(), err
}

// inspectShared is InspectShared in lease mode.
func (l *leaseLocker) inspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	rows, err := l.pool.Query(ctx, l.shsql.inspect, l.args(sharedLeaseID(l.ns, mode, key))...)
	if err != nil {
		return nil, l.fail(ctx, "inspect", unavailable(err))
	}
	hs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (driver.SharedInfo, error) {
		var owner []byte
		var m int16
		var tok, rem int64
		err := r.Scan(&owner, &m, &tok, &rem)
		return driver.SharedInfo{Info: driver.Info{Owner: string(owner), Token: uint64(tok),
			Remaining: max(time.Duration(rem)*time.Millisecond, time.Millisecond)}, Mode: driver.SharedMode(m)}, err
	})
	if err != nil {
		return nil, l.fail(ctx, "inspect", unavailable(err))
	}
	return hs, nil
}
