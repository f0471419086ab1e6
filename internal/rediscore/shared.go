package rediscore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
)

// Shared holds (driver.SharedLocker) on one deployment: semaphores and
// read-write locks. See shared_scripts.go for the keys and scripts, and the
// package documentation, "Shared holds", for the design and its reasons.

// SharedKeys returns the seven keys of the shared lock that mode names on
// key (see shared_scripts.go): the semaphore's for driver.SharedPermit,
// the read-write lock's for driver.SharedRead and driver.SharedWrite. They
// extend the lock key (Keys) with ":sem" or ":rw", so they never name a
// mutex key or each other's, and keep its hash tag (one Cluster slot); the
// token counter is the mutex's.
func SharedKeys(prefix, key string, mode driver.SharedMode) []string {
	lock, counter, _ := Keys(prefix, key)
	z := lock + ":sem"
	if mode.RW() {
		z = lock + ":rw"
	}
	q, qt := QueueKeys(z)
	return []string{z, z + ":d", counter, q, qt, z + ":qa", z + ":qg"}
}

// modeArg is a mode as the scripts spell it: the first letter of its name
// (s, r or w).
func modeArg(m driver.SharedMode) string { return m.String()[:1] }

// modeOf is the mode the scripts spell s (see modeArg).
func modeOf(s string) driver.SharedMode {
	for m := driver.SharedPermit; m.Valid(); m++ {
		if modeArg(m) == s {
			return m
		}
	}
	return 0
}

// checkShared validates a shared call: as Node.check, then the mode (and,
// for an acquire, the limit).
func (n *Node) checkShared(ctx context.Context, key, owner string, mode driver.SharedMode, ttl time.Duration, needTTL, needOwner bool) error {
	if err := n.check(ctx, key, owner, ttl, needTTL, needOwner); err != nil {
		return err
	}
	if err := driver.CheckMode(mode); err != nil {
		return n.p.errorf("%w", err)
	}
	return nil
}

// AcquireShared implements driver.SharedLocker: one EVALSHA of
// SharedAcquireScript for a hold that fits, or a one-shot request. A
// waiting request that does not fit joins the lock's fair queue with its
// mode and is woken when it was granted (see AcquireWait, whose loop it
// runs); when its ctx ends it leaves the queue, freeing a grant made
// meanwhile, before it returns. Errors as for Acquire; an owner holding
// the read-write lock in the other mode gets driver.ErrInvalid at once.
func (n *Node) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if err := n.checkShared(ctx, key, req.Owner, req.Mode, req.TTL, true, true); err != nil {
		return 0, err
	}
	if err := driver.CheckLimit(req); err != nil {
		return 0, n.p.errorf("%w", err)
	}
	exit, ok := n.enter()
	if !ok {
		return 0, n.p.errorf("acquire: %w", driver.ErrClosed)
	}
	defer exit()
	if !req.Wait {
		return n.acquireOnce(ctx, key, req)
	}
	w := n.newSharedWait(key, req)
	defer n.route.add(w.lock, w.q)()
	return w.run(ctx)
}

func (n *Node) newSharedWait(key string, req driver.SharedRequest) *queuedWait {
	keys := SharedKeys(n.o.Prefix, key, req.Mode)
	w := &queuedWait{n: n, owner: req.Owner, lock: keys[0], wake: WakeChannel(n.o.Prefix, ""),
		keys: keys, q: newQueueWaiter(), retry: retryMin}
	w.args = []string{req.Owner, ttlMS(n.Capabilities(), req.TTL), n.retMS, "",
		strconv.FormatInt(n.o.QueueTTL.Milliseconds(), 10), w.wake, "0", modeArg(req.Mode), strconv.Itoa(req.Limit)}
	w.waitSpec = waitSpec{script: SharedAcquireScript, sync: true,
		parse: func(v any, err error) grant { return n.p.parseShared(v, err, req.Mode) },
		leave: w.leaveShared}
	w.setElement()
	if n.listening.Load() && n.listener != nil {
		w.setJoin()
	}
	return w
}

// acquireOnce is a one-shot AcquireShared: one attempt that never joins
// the queue (no element, so it collects no queued grant). If ctx ends
// while the script runs, a grant it made is freed in the background.
func (n *Node) acquireOnce(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	keys := SharedKeys(n.o.Prefix, key, req.Mode)
	wake := WakeChannel(n.o.Prefix, "")
	args := []string{req.Owner, ttlMS(n.Capabilities(), req.TTL), n.retMS, "", "0", wake, "0", modeArg(req.Mode), strconv.Itoa(req.Limit)}
	v, err, abandoned := n.runDetached(ctx, SharedAcquireScript, keys, args, func(g grant) {
		if g.kind == grantCreated {
			el := "~" + n.wid + ":" + req.Owner
			ctx, cancel := context.WithTimeout(context.Background(), n.detachedTimeout())
			defer cancel()
			_, _ = n.c.Run(ctx, SharedLeaveScript, keys, el, n.retMS, wake, strconv.FormatUint(g.token, 10))
		}
	})
	if abandoned {
		return 0, n.p.errorf("acquire: %w", ctx.Err())
	}
	g := n.p.parseShared(v, err, req.Mode)
	switch g.kind {
	case grantCreated, grantExisting:
		return g.token, nil
	case grantHeld:
		if g.pttl > 0 {
			return 0, &driver.HeldError{Remaining: g.pttl}
		}
		return 0, n.p.errorf("acquire: %w", driver.ErrNotAcquired)
	}
	return 0, n.p.ctxErr(ctx, "acquire", g.err)
}

// leaveShared takes the waiter out of the queue and frees a grant made for
// it: g if this wait's attempt created it, or one the queue made that it
// never collected. A wait that never joined has only g to free.
func (w *queuedWait) leaveShared(g grant) {
	if !w.join && g.kind != grantCreated {
		return
	}
	tok := ""
	if g.kind == grantCreated {
		tok = strconv.FormatUint(g.token, 10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(w.n.detachedTimeout(), w.n.o.QueueTTL))
	defer cancel()
	_, _ = w.n.c.Run(ctx, SharedLeaveScript, w.keys, w.args[3], w.n.retMS, w.wake, tok)
}

// parseShared parses a SharedAcquireScript reply: AcquireScript's shapes,
// or {"mode", m} for an owner that holds the lock in mode m, not want.
func (p prefix) parseShared(v any, err error, want driver.SharedMode) grant {
	if a, ok := v.([]any); ok && err == nil && len(a) == 2 && a[0] == "mode" {
		held, _ := a[1].(string)
		return grant{err: fmt.Errorf("%w: the owner holds the %s lock and asks for the %s lock; "+
			"there are no upgrades or downgrades: release it first", driver.ErrInvalid, modeOf(held), want)}
	}
	return p.parseGrant(v, err)
}

// RefreshShared implements driver.SharedLocker: one EVALSHA of
// SharedRefreshScript; driver.ErrNotHeld if owner holds no live hold of
// key in mode (an ended lease is never revived).
func (n *Node) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if err := n.checkShared(ctx, key, owner, mode, ttl, true, true); err != nil {
		return err
	}
	r, err := n.run(ctx, SharedRefreshScript, SharedKeys(n.o.Prefix, key, mode), owner, modeArg(mode),
		ttlMS(n.Capabilities(), ttl), WakeChannel(n.o.Prefix, ""))
	return n.p.sharedDone(ctx, "refresh", r, err)
}

// ReleaseShared implements driver.SharedLocker: one EVALSHA of
// SharedReleaseScript, which grants the queue from its head as far as it
// now fits; driver.ErrNotHeld if owner holds no live hold of key in mode.
func (n *Node) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if err := n.checkShared(ctx, key, owner, mode, 0, false, true); err != nil {
		return err
	}
	r, err := n.run(ctx, SharedReleaseScript, SharedKeys(n.o.Prefix, key, mode), owner, modeArg(mode),
		n.retMS, WakeChannel(n.o.Prefix, ""))
	return n.p.sharedDone(ctx, "release", r, err)
}

// sharedDone is the outcome of a refresh or release: nil for the reply 1,
// driver.ErrNotHeld for another.
func (p prefix) sharedDone(ctx context.Context, op string, r any, err error) error {
	if err != nil {
		return p.ctxErr(ctx, op, err)
	}
	if v, _ := asInt(r); v != 1 {
		return p.errorf("%s: %w", op, driver.ErrNotHeld)
	}
	return nil
}

// InspectShared implements driver.SharedLocker: one EVALSHA of
// SharedInspectScript; the live holders in token order, an empty list
// when there are none.
func (n *Node) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := n.checkShared(ctx, key, "", mode, 0, false, false); err != nil {
		return nil, err
	}
	r, err := n.run(ctx, SharedInspectScript, SharedKeys(n.o.Prefix, key, mode)[:2])
	if err != nil {
		return nil, n.p.ctxErr(ctx, "inspect", err)
	}
	return n.p.parseHolders(r)
}

func (p prefix) parseHolders(r any) ([]driver.SharedInfo, error) {
	a, ok := r.([]any)
	if !ok || len(a)%3 != 0 {
		return nil, p.errorf("inspect: unexpected reply %v", r)
	}
	out := make([]driver.SharedInfo, 0, len(a)/3)
	for i := 0; i < len(a); i += 3 {
		owner, _ := a[i].(string)
		v, _ := a[i+1].(string)
		j := strings.LastIndexByte(v, ':')
		if j < 0 {
			return nil, p.errorf("inspect: malformed holder %q", v)
		}
		tok, err := p.parseToken(v[:j])
		if err != nil {
			return nil, err
		}
		ms, _ := asInt(a[i+2])
		out = append(out, driver.SharedInfo{
			Info: driver.Info{Owner: owner, Token: tok, Remaining: time.Duration(ms) * time.Millisecond},
			Mode: modeOf(v[j+1:]),
		})
	}
	slices.SortFunc(out, func(x, y driver.SharedInfo) int { return cmp.Compare(x.Token, y.Token) })
	return out, nil
}

// SharedUnsupported implements driver.SharedRefuser: nil on one deployment;
// under Redlock an error matching errors.ErrUnsupported that names the
// driver and the reason, which every shared call returns before any I/O.
func (l *Locker) SharedUnsupported() error {
	if l.node != nil {
		return nil
	}
	return l.p.errorf("Redlock has no semaphores or read-write locks: its independent majorities "+
		"could admit different sets of n holders, so the limit could not be kept: %w", errors.ErrUnsupported)
}

// AcquireShared implements driver.SharedLocker (Node.AcquireShared); under
// Redlock it fails before any I/O (SharedUnsupported).
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if err := l.SharedUnsupported(); err != nil {
		return 0, err
	}
	return l.node.AcquireShared(ctx, key, req)
}

// RefreshShared implements driver.SharedLocker (Node.RefreshShared); under
// Redlock it fails before any I/O (SharedUnsupported).
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if err := l.SharedUnsupported(); err != nil {
		return err
	}
	return l.node.RefreshShared(ctx, key, mode, owner, ttl)
}

// ReleaseShared implements driver.SharedLocker (Node.ReleaseShared); under
// Redlock it fails before any I/O (SharedUnsupported).
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if err := l.SharedUnsupported(); err != nil {
		return err
	}
	return l.node.ReleaseShared(ctx, key, mode, owner)
}

// InspectShared implements driver.SharedLocker (Node.InspectShared); under
// Redlock it fails before any I/O (SharedUnsupported).
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := l.SharedUnsupported(); err != nil {
		return nil, err
	}
	return l.node.InspectShared(ctx, key, mode)
}
