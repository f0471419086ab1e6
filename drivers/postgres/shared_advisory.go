package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The retry schedule of the first waiter of a semaphore in advisory mode,
// the holder of its gate (see permitGate): which slot frees first is not
// known, so it tries the slots after permitWaitMin, doubling to
// permitWaitMax, and at once when a permit of any key is released through
// the same Locker. The waiters behind it wait in the server's lock
// manager for the gate, and make no statement until they hold it.
const (
	permitWaitMin = time.Millisecond
	permitWaitMax = 50 * time.Millisecond
)

// sharedAdv is the advisory key of the shared lock mode names on key: the
// read-write lock's key, or the semaphore's base key (the low 11 bits
// cleared: its slots are base+0 to base+MaxSharedLimit-1, its guard
// base+permitGuard).
func sharedAdv(ns string, mode driver.SharedMode, key string) int64 {
	h := sharedHash(ns, sharedKind(mode), key)
	if mode == driver.SharedPermit {
		h &^= permitSpan - 1
	}
	return int64(h)
}

// sharedID is the slotID of owner's hold of key in mode; mode 0 is the
// mutex (refreshShared and releaseShared serve Refresh and Release too).
func sharedID(key string, mode driver.SharedMode, owner string) slotID {
	if mode == 0 {
		return mutexID(key)
	}
	return slotID{kind: sharedKind(mode), key: key, owner: owner}
}

// acquireShared is AcquireShared in advisory mode; the request is valid.
func (l *advisoryLocker) acquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	c, err := l.newCall(key, req.Owner, req.TTL)
	if err != nil {
		return 0, err
	}
	c.mode, c.limit, c.adv = req.Mode, req.Limit, sharedAdv(l.ns, req.Mode, key)
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	id := sharedID(key, req.Mode, req.Owner)
	s := l.getSlot(id)
	defer l.putSlot(id, s)
	if tok, ok, err := l.reacquireShared(ctx, s, c); ok || err != nil {
		return tok, err
	}
	var h *hold
	if req.Mode == driver.SharedPermit && req.Wait {
		h, err = l.waitPermit(ctx, c)
	} else {
		h, err = l.grant(ctx, c, req.Wait)
	}
	if err != nil {
		return 0, err
	}
	h.key, h.mode = key, req.Mode
	l.install(s, h)
	return h.token, nil
}

// reacquireShared is AcquireShared by an owner that holds the lock through
// this Locker: in the same mode it refreshes the hold and returns its
// token (ok); in the other mode of a read-write lock it fails with
// driver.ErrInvalid. A hold whose session is gone is dropped (not ok, no
// error).
func (l *advisoryLocker) reacquireShared(ctx context.Context, s *slot, c *call) (uint64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.h
	if h == nil {
		return 0, false, nil
	}
	if h.mode != c.mode {
		return 0, false, fmt.Errorf("postgres: acquire %q: owner holds the %v side of the read-write lock (no upgrades or downgrades: release it first): %w",
			c.key, h.mode, driver.ErrInvalid)
	}
	err := l.refreshLocked(ctx, s, c)
	if err == nil {
		return h.token, true, nil
	}
	if !errors.Is(err, driver.ErrNotHeld) || ctx.Err() != nil {
		return 0, false, l.fail(ctx, "acquire", err)
	}
	return 0, false, nil
}

// waitPermit takes a permit: it waits in the server for the semaphore's
// gate, in arrival order, then (holding the gate) tries the slots on the
// permit wait schedule until one is granted, an attempt fails otherwise,
// or ctx ends. A session lost while it holds the gate queues again; the
// server is waited for as AcquireWait does.
func (l *advisoryLocker) waitPermit(ctx context.Context, c *call) (*hold, error) {
	delay, lost := rewaitMin, false
	for {
		h, err := l.grant(ctx, c, true)
		var g gateHeld
		switch {
		case errors.As(err, &g):
		case lost && errors.Is(err, driver.ErrUnavailable) && ctx.Err() == nil:
			if !l.pause(ctx, &delay) {
				return nil, l.fail(ctx, "acquire", fmt.Errorf("%w (while waiting, last error: %w)", ctx.Err(), err))
			}
			continue
		default:
			return h, err
		}
		h, err = l.headPermit(ctx, g.conn, c)
		if !errors.Is(err, errGateLost) {
			return h, err
		}
		lost = true
	}
}

// gateHeld is waitOn's report that a waiting permit's statement took the
// semaphore's gate on conn, and no slot.
type gateHeld struct{ conn *pgxpool.Conn }

func (gateHeld) Error() string { return "postgres: acquire: permit gate held, no slot free" }

// errGateLost is headPermit's report that the session holding the gate
// ended under it: the wait queues again.
var errGateLost = errors.New("postgres: the session holding the permit gate was lost")

// headPermit tries the slots on conn, whose session holds the semaphore's
// gate, on the permit wait schedule. It lets the gate go (conn with it)
// when the wait ends without a grant.
func (l *advisoryLocker) headPermit(ctx context.Context, conn *pgxpool.Conn, c *call) (*hold, error) {
	gc := *c
	gc.gated = true
	wake := l.permitWake()
	for delay := permitWaitMin; ; delay = min(2*delay, permitWaitMax) {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-wake:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			letGo(conn)
			return nil, l.fail(ctx, "acquire", ctx.Err())
		}
		wake = l.permitWake() // a release during the attempt wakes the next
		r, cut, err := l.runGuarded(ctx, conn, false, &gc)
		switch {
		case cut:
			l.abandon(conn, c.adv)
			return nil, l.fail(ctx, "acquire", ctx.Err())
		case err != nil && lostSession(err):
			destroy(conn)
			return nil, errGateLost
		case err != nil:
			letGo(conn)
			return nil, l.fail(ctx, "acquire", sqlError(err))
		case r.pooler:
			destroy(conn)
			return nil, ErrPooler
		case r.granted:
			return newHold(conn, c, r), nil
		}
	}
}

// permitWake returns the channel the next permit release through this
// Locker closes.
func (l *advisoryLocker) permitWake() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pwake == nil {
		l.pwake = make(chan struct{})
	}
	return l.pwake
}

// permitFreed wakes the permit waits of this Locker.
func (l *advisoryLocker) permitFreed() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pwake != nil {
		close(l.pwake)
		l.pwake = nil
	}
}

// heldShared is heldSlot for the hold owner has of key in mode.
func (l *advisoryLocker) heldShared(op, key string, mode driver.SharedMode, owner string) (*slot, func(), error) {
	s, unlock, err := l.heldSlot(op, sharedID(key, mode, owner), owner)
	if err != nil {
		return nil, nil, err
	}
	if s.h.mode != mode {
		unlock()
		return nil, nil, notHeld(op, key)
	}
	return s, unlock, nil
}

// refreshShared is RefreshShared in advisory mode (and with mode 0
// Refresh); the arguments are valid.
func (l *advisoryLocker) refreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	c, err := l.newCall(key, owner, ttl)
	if err != nil {
		return err
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	s, unlock, err := l.heldShared("refresh", key, mode, owner)
	if err != nil {
		return err
	}
	defer unlock()
	if err := l.refreshLocked(ctx, s, c); err != nil {
		return l.failHeld(ctx, "refresh", err)
	}
	return nil
}

// releaseShared is ReleaseShared in advisory mode (and with mode 0
// Release); the arguments are valid.
func (l *advisoryLocker) releaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return err
	}
	defer done()
	s, unlock, err := l.heldShared("release", key, mode, owner)
	if err != nil {
		return err
	}
	defer unlock()
	sql := l.shsql.release[mode]
	if mode == 0 {
		sql = l.sql.release
	}
	err = l.releaseLocked(ctx, s, key, sql)
	if mode == driver.SharedPermit {
		l.permitFreed()
	}
	return err
}

// inspectShared is InspectShared in advisory mode: the sessions pg_locks
// shows holding the lock's keys, described by their application_name.
func (l *advisoryLocker) inspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	k := uint64(sharedAdv(l.ns, mode, key))
	lo, span := int64(uint32(k)), int64(1)
	if mode == driver.SharedPermit {
		span = driver.MaxSharedLimit
	}
	rows, err := l.pool.Query(ctx, sharedHoldersSQL, uint32(k>>32), lo, lo+span)
	if err != nil {
		return nil, l.fail(ctx, "inspect", unavailable(err))
	}
	defer rows.Close()
	var hs []driver.SharedInfo
	for rows.Next() {
		var lockMode string
		var app, state *string
		var idle *int64
		if err := rows.Scan(&lockMode, &app, &state, &idle); err != nil {
			return nil, l.fail(ctx, "inspect", err)
		}
		info := driver.SharedInfo{Mode: driver.SharedPermit}
		if mode != driver.SharedPermit {
			info.Mode = driver.SharedRead
			if lockMode == "ExclusiveLock" {
				info.Mode = driver.SharedWrite
			}
		}
		if app != nil {
			if token, ttlMS, tag, ok := parseAppName(*app); ok {
				info.Owner, info.Token = tag, token
				info.Remaining = remainingOf(ttlMS, state, idle)
			}
		}
		hs = append(hs, info)
	}
	if err := rows.Err(); err != nil {
		return nil, l.fail(ctx, "inspect", unavailable(err))
	}
	l.localOwners(key, mode, hs)
	return hs, nil
}

// remainingOf is a session's remaining TTL from its application_name's TTL,
// its state and its idle time; 0 if unknown.
func remainingOf(ttlMS int64, state *string, idle *int64) time.Duration {
	if state == nil || idle == nil {
		return 0
	}
	rem := time.Duration(ttlMS) * time.Millisecond
	if *state == "idle" {
		rem -= time.Duration(*idle) * time.Millisecond
	}
	return max(rem, time.Millisecond)
}

// localOwners puts the full owner string in place of the tag for the
// holds in hs that this Locker holds.
func (l *advisoryLocker) localOwners(key string, mode driver.SharedMode, hs []driver.SharedInfo) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, s := range l.slots {
		if id.kind != sharedKind(mode) || id.key != key || s.cur == nil {
			continue
		}
		for i := range hs {
			if hs[i].Token == s.cur.token {
				hs[i].Owner = s.cur.owner
			}
		}
	}
}
