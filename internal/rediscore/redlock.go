package rediscore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// Redlock implements driver.Locker, driver.Inspector, driver.Capable and
// driver.Pinger over N independent masters with the Redlock algorithm:
//
//   - Acquire runs AcquireScript (same key, same owner) first on one node
//     chosen by a hash of the key (the gate: every contender for the key
//     uses the same one, so concurrent contenders do not split the vote;
//     a loser there stops with the holder's PTTL), then on every other node
//     in parallel (on all of them when the gate does not answer), each call
//     bounded by NodeTimeout. It needs a quorum of N/2+1 grants, and the
//     grant is valid only if ttl - elapsed - (ttl*DriftFactor + 2ms) > 0
//     once it is complete (token write-back included).
//   - On failure it deletes the grants it created (see cleanup: never a
//     lock owner held before the attempt), and returns a *HeldError whose
//     Remaining is when the holders' quorum expires, or, after a split vote,
//     a random delay in [1ms, NodeTimeout]: the caller's retry is jittered.
//   - Refresh succeeds only when it lands on a quorum; Release releases on
//     every node.
//
// Tokens: each granting node mints max(counter+1, its TIME in µs); the grant
// takes T = the maximum over the quorum and writes T back (FenceScript) to
// every granting node, raising its counter to T, before returning. Any later
// grant needs a quorum that intersects the write-back quorum in at least one
// node, whose counter is >= T, so its token is > T: tokens strictly increase
// as long as no node of that intersection lost its data, or, if one did, as
// long as the nodes' clocks agree within the time between the two grants
// (the TIME floor). The price is a second round trip per acquire.
// Idempotent re-acquire returns the same token while every node of the
// quorum still holds the lock; if the lock lapsed on some node meanwhile,
// the re-acquire returns a larger token (still a valid fencing token).
type Redlock struct {
	p      prefix // starts every error
	conns  []Conn
	o      Options
	q      int
	closed atomic.Bool
	retMS  string

	closeMu sync.Mutex     // orders enter against Close
	bg      sync.WaitGroup // acquires in flight and their clean-ups: Close waits for them

	// abandoned, when set (tests), is called with the per-node outcomes of
	// an acquire whose ctx ended mid-round, once the clean-up is done.
	abandoned func([]grant)
}

// NewRedlock returns a Redlock over conns (N >= 2 independent masters;
// with N = 2 the quorum is 2 and no failure is tolerated, so use N >= 3).
// Zero fields of o take their defaults. Close closes every Conn.
func NewRedlock(conns []Conn, o Options) *Redlock {
	o = o.WithDefaults()
	return &Redlock{p: "redis", conns: conns, o: o, q: len(conns)/2 + 1,
		retMS: strconv.FormatInt(o.TokenRetention.Milliseconds(), 10)}
}

// Quorum returns N/2+1.
func (r *Redlock) Quorum() int { return r.q }

// Options returns the options in effect, defaults applied.
func (r *Redlock) Options() Options { return r.o }

// redlockDriftFixed is the fixed part of Redlock's drift allowance, added to
// ttl×DriftFactor in the validity check and in the holder's deadline margin.
const redlockDriftFixed = 2 * time.Millisecond

// Capabilities reports MinTTL = max(10ms, 3*NodeTimeout) (a grant takes up
// to two rounds of NodeTimeout and must leave a positive validity),
// millisecond granularity, durable tokens (see the type's doc), and the
// drift allowance ttl×DriftFactor + 2ms, so that package locker's safe
// deadline is never later than the end of the validity window.
func (r *Redlock) Capabilities() driver.Capabilities {
	return driver.Capabilities{MinTTL: max(MinTTL, 3*r.o.NodeTimeout), TTLGranularity: time.Millisecond, DurableTokens: true,
		DriftFactor: r.o.DriftFactor, DriftFixed: redlockDriftFixed}
}

type result struct {
	v   any
	err error
}

// each runs fn on every node in parallel, each call bounded by NodeTimeout
// (and ctx). It returns when every node answered or timed out; a node that
// did not answer in time gets an error wrapping context.DeadlineExceeded.
func (r *Redlock) each(ctx context.Context, s *Script, keys []string, args ...string) []result {
	return r.eachExcept(ctx, -1, s, keys, args...)
}

// eachExcept is each without node skip (its result is left zero).
func (r *Redlock) eachExcept(ctx context.Context, skip int, s *Script, keys []string, args ...string) []result {
	res := make([]result, len(r.conns))
	todo := len(r.conns)
	if skip >= 0 {
		todo--
	}
	type msg struct {
		i int
		result
	}
	ch := make(chan msg, len(r.conns))
	ctx, cancel := context.WithTimeout(ctx, r.o.NodeTimeout)
	defer cancel()
	for i, c := range r.conns {
		if i == skip {
			continue
		}
		go func() {
			v, err := c.Run(ctx, s, keys, args...)
			ch <- msg{i, result{v, err}}
		}()
	}
	for i := range res {
		if i != skip {
			res[i].err = errNoAnswer
		}
	}
	for n := 0; n < todo; n++ {
		select {
		case m := <-ch:
			res[m.i] = m.result
		case <-ctx.Done():
			for i := range res {
				if res[i].err == errNoAnswer {
					res[i].err = fmt.Errorf("node %d: no answer within node_timeout %v: %w", i, r.o.NodeTimeout, ctx.Err())
				}
			}
			return res
		}
	}
	return res
}

var errNoAnswer = errors.New("no answer")

func (r *Redlock) check(ctx context.Context, key, owner string, ttl time.Duration, needTTL, needOwner bool) error {
	return r.p.checkCall(ctx, r.closed.Load(), r.o.MaxKeyLen, key, owner, ttl, needTTL, needOwner)
}

func firstErr(res []result) error {
	for i, x := range res {
		if x.err != nil {
			if errors.Is(x.err, errNoAnswer) {
				return fmt.Errorf("node %d: %w", i, x.err)
			}
			return x.err
		}
	}
	return nil
}

// Acquire implements driver.Locker with the Redlock algorithm (see the
// type's doc). Errors: *driver.HeldError (wrapping ErrNotAcquired) when
// other owners hold a quorum or after a split vote; an error naming the
// counts when too few nodes answered; ctx.Err() wrapped once ctx is done.
// A failed or cancelled acquire is released on every node.
func (r *Redlock) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := r.check(ctx, key, owner, ttl, true, true); err != nil {
		return 0, err
	}
	exit, ok := r.enter()
	if !ok {
		return 0, r.p.errorf("redlock acquire: %w", driver.ErrClosed)
	}
	defer exit()
	start := time.Now()
	ttl = r.Capabilities().RoundTTL(ttl)
	lock, counter, ch := Keys(r.o.Prefix, key)
	a := &redlockAttempt{r: r, start: start, ttl: ttl, owner: owner, lock: lock, ch: ch, keys: []string{lock, counter}}
	res, err := a.vote(ctx, key)
	if err != nil {
		return 0, err
	}
	t := a.tally(res)
	if t.granted >= r.q && ctx.Err() == nil {
		return a.confirm(ctx, t)
	}
	return 0, a.refused(ctx, t, res)
}

// redlockAttempt is one Redlock.Acquire.
type redlockAttempt struct {
	r               *Redlock
	start           time.Time
	ttl             time.Duration // rounded
	owner, lock, ch string
	keys            []string // AcquireScript's
}

// redlockTally counts a round's outcomes.
type redlockTally struct {
	grants   []grant // per node
	granted  int
	held     []time.Duration // the PTTLs of the other owners' locks
	failed   int
	maxToken uint64
}

// vote runs AcquireScript on the gate, then, unless another owner holds
// the key there, on every other node. The gate: every contender for key
// first tries the same node (by a hash of key). Losers stop there, so
// concurrent contenders do not split the vote and exactly one of them
// wins; only the gate's winner (or everyone, when the gate does not
// answer) goes on to the others. An error ends the attempt: the gate's
// *driver.HeldError, or ctx's end (the round's grants are then cleaned up
// in the background).
func (a *redlockAttempt) vote(ctx context.Context, key string) ([]result, error) {
	r := a.r
	n := len(r.conns)
	ms := strconv.FormatInt(a.ttl.Milliseconds(), 10)
	gate := r.gate(key)
	res := make([]result, n)
	if finish := r.acquireRound(ctx, []int{gate}, res, a.keys, a.owner, ms, r.retMS); finish != nil {
		r.background(func() { r.abandon(ctx, finish, res, a.lock, a.ch, a.owner) })
		return nil, r.p.errorf("redlock acquire: %w", ctx.Err())
	}
	if g := r.p.parseGrant(res[gate].v, res[gate].err); g.kind == grantHeld {
		return nil, &driver.HeldError{Remaining: max(g.pttl, 0) + r.jitter()}
	}
	others := make([]int, 0, n-1)
	for i := range n {
		if i != gate {
			others = append(others, i)
		}
	}
	if finish := r.acquireRound(ctx, others, res, a.keys, a.owner, ms, r.retMS); finish != nil {
		r.background(func() { r.abandon(ctx, finish, res, a.lock, a.ch, a.owner) })
		return nil, r.p.errorf("redlock acquire: %w", ctx.Err())
	}
	return res, nil
}

// tally parses every node's reply; a malformed one counts as failed, its
// error kept in res.
func (a *redlockAttempt) tally(res []result) redlockTally {
	t := redlockTally{grants: make([]grant, len(res))}
	for i, x := range res {
		t.grants[i] = a.r.p.parseGrant(x.v, x.err)
		switch gr := t.grants[i]; gr.kind {
		case grantUnknown:
			t.failed++
			if res[i].err == nil {
				res[i].err = gr.err
			}
		case grantHeld:
			t.held = append(t.held, gr.pttl)
		default:
			t.granted++
			t.maxToken = max(t.maxToken, gr.token)
		}
	}
	return t
}

// confirm completes a quorum of grants: it writes the grant's token back
// to the granting nodes and checks the validity left; on failure it
// deletes what the attempt created.
func (a *redlockAttempt) confirm(ctx context.Context, t redlockTally) (uint64, error) {
	r := a.r
	tok := strconv.FormatUint(t.maxToken, 10)
	cpx := strconv.FormatInt((a.ttl + r.o.TokenRetention).Milliseconds(), 10)
	fres := r.each(ctx, FenceScript, a.keys, a.owner, tok, cpx)
	fenced := 0
	for _, x := range fres {
		if v, ok := asInt(x.v); ok && v == 1 && x.err == nil {
			fenced++
		}
	}
	drift := time.Duration(float64(a.ttl)*r.o.DriftFactor) + redlockDriftFixed
	validity := a.ttl - time.Since(a.start) - drift
	if fenced >= r.q && validity > 0 && ctx.Err() == nil {
		return t.maxToken, nil
	}
	if err := ctx.Err(); err != nil {
		r.background(func() { r.cleanup(ctx, a.lock, a.ch, a.owner, t.grants, t.maxToken) })
		return 0, r.p.errorf("redlock acquire: %w", err)
	}
	r.cleanup(ctx, a.lock, a.ch, a.owner, t.grants, t.maxToken)
	if fenced < r.q {
		return 0, r.p.errorf("redlock acquire: token write-back reached %d of %d nodes (quorum %d): %w: %v", fenced, len(r.conns), r.q, driver.ErrUnavailable, firstErr(fres))
	}
	return 0, &driver.HeldError{Remaining: r.jitter()}
}

// refused ends an attempt without a quorum (or whose ctx ended): it
// deletes what the attempt created and says why.
func (a *redlockAttempt) refused(ctx context.Context, t redlockTally, res []result) error {
	r := a.r
	n := len(r.conns)
	if err := ctx.Err(); err != nil {
		r.background(func() { r.cleanup(ctx, a.lock, a.ch, a.owner, t.grants, 0) })
		return r.p.errorf("redlock acquire: %w", err)
	}
	r.cleanup(ctx, a.lock, a.ch, a.owner, t.grants, 0)
	if len(t.held) >= n-r.q+1 {
		// Other owners hold a quorum: wait until enough of them expire
		// that the rest of the nodes form a quorum.
		slices.Sort(t.held)
		k := len(t.held) - (n - r.q) // holders that must expire
		return &driver.HeldError{Remaining: max(t.held[k-1], 0) + r.jitter()}
	}
	if t.failed >= n-r.q+1 {
		return AsUnavailable(r.p.errorf("redlock acquire: no quorum: %d of %d nodes granted, %d held by another owner, %d failed (quorum %d): %w",
			t.granted, n, len(t.held), t.failed, r.q, firstErr(res)))
	}
	// Split vote between contenders: retry after a random delay.
	return &driver.HeldError{Remaining: r.jitter()}
}

// cleanup undoes a failed or abandoned acquire, even if ctx is done, without
// ever freeing a lock owner held before the attempt:
//
//   - a node where the attempt created a grant: that grant is deleted, by
//     its token (as minted, or fenced, the write-back's token, when nonzero),
//     with CleanupScript;
//   - a node that reported owner already held the lock there: untouched;
//   - a node whose outcome is unknown (no answer, or not asked): owner's
//     lock there is released (its reply may have been lost) only when the
//     attempt proves owner did not hold a quorum before it, that is, no node
//     reported an existing grant and fewer than a quorum are unknown.
//     Otherwise it is left to expire at its TTL.
func (r *Redlock) cleanup(ctx context.Context, lock, ch, owner string, grants []grant, fenced uint64) {
	existing, unknown := 0, 0
	for _, g := range grants {
		switch g.kind {
		case grantExisting:
			existing++
		case grantUnknown:
			unknown++
		}
	}
	heldBefore := existing > 0 || unknown >= r.q
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.NodeTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, g := range grants {
		var (
			s    *Script
			args []string
		)
		switch {
		case g.kind == grantCreated:
			s, args = CleanupScript, []string{owner, ch, WakeChannel(r.o.Prefix, ""), strconv.FormatUint(g.token, 10)}
			if fenced != 0 && fenced != g.token {
				args = append(args, strconv.FormatUint(fenced, 10))
			}
		case g.kind == grantUnknown && !heldBefore:
			s, args = ReleaseScript, []string{owner, ch, WakeChannel(r.o.Prefix, "")}
		default:
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = r.conns[i].Run(ctx, s, lockAndQueue(lock), args...)
		}()
	}
	wg.Wait()
}

// acquireRound runs AcquireScript on nodes in parallel, detached from
// ctx's cancellation and bounded by NodeTimeout, and stores each reply in
// res (a node that did not answer within NodeTimeout gets an error). It
// returns nil once every node answered or timed out. If ctx ends first it
// returns at once with finish, which waits for the remaining replies and
// stores them: an attempt abandoned mid-call still learns what it created
// (see abandon). res must not be read meanwhile.
func (r *Redlock) acquireRound(ctx context.Context, nodes []int, res []result, keys []string, args ...string) (finish func()) {
	type msg struct {
		i int
		result
	}
	ch := make(chan msg, len(nodes))
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.o.NodeTimeout)
	for _, i := range nodes {
		res[i] = result{err: errNoAnswer}
		go func() {
			v, err := r.conns[i].Run(dctx, AcquireScript, keys, args...)
			ch <- msg{i, result{v, err}}
		}()
	}
	pending := len(nodes)
	for pending > 0 {
		select {
		case m := <-ch:
			res[m.i] = m.result
			pending--
		case <-dctx.Done():
			for _, i := range nodes {
				if res[i].err == errNoAnswer {
					res[i].err = fmt.Errorf("node %d: no answer within node_timeout %v: %w", i, r.o.NodeTimeout, dctx.Err())
				}
			}
			cancel()
			return nil
		case <-ctx.Done():
			return func() {
				defer cancel()
				for ; pending > 0; pending-- {
					select {
					case m := <-ch:
						res[m.i] = m.result
					case <-dctx.Done():
						return
					}
				}
			}
		}
	}
	cancel()
	return nil
}

// abandon finishes an acquire whose ctx ended mid-round: it waits for the
// round's replies, then deletes the grants the attempt created (cleanup).
func (r *Redlock) abandon(ctx context.Context, finish func(), res []result, lock, ch, owner string) {
	finish()
	grants := make([]grant, len(res))
	for i, x := range res {
		grants[i] = r.p.parseGrant(x.v, x.err)
	}
	r.cleanup(ctx, lock, ch, owner, grants, 0)
	if r.abandoned != nil {
		r.abandoned(grants)
	}
}

// gate returns the node every contender for key tries first.
func (r *Redlock) gate(key string) int { return int(fnv32(key) % uint32(len(r.conns))) }

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func (r *Redlock) jitter() time.Duration {
	return time.Millisecond + rand.N(r.o.NodeTimeout)
}

// Refresh implements driver.Locker: RefreshScript on every node; it succeeds
// only when a quorum refreshed. ErrNotHeld when so many nodes answered "not
// held" that no quorum can hold it; any other shortfall is a transient error.
func (r *Redlock) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := r.check(ctx, key, owner, ttl, true, true); err != nil {
		return err
	}
	c := refreshCall(r.o.Prefix, key, owner, ttlMS(r.Capabilities(), ttl))
	return r.refreshTally(ctx, r.each(ctx, RefreshScript, c.Keys, c.Args...))
}

// refreshTally decides a refresh from the nodes' RefreshScript replies.
func (r *Redlock) refreshTally(ctx context.Context, res []result) error {
	ok, notHeld := 0, 0
	for _, x := range res {
		if x.err != nil {
			continue
		}
		if v, _ := asInt(x.v); v == 1 {
			ok++
		} else {
			notHeld++
		}
	}
	n := len(r.conns)
	switch {
	case ok >= r.q:
		return nil
	case ctx.Err() != nil:
		return r.p.errorf("redlock refresh: %w", ctx.Err())
	case notHeld >= n-r.q+1:
		return r.p.errorf("redlock refresh: held on %d of %d nodes: %w", ok, n, driver.ErrNotHeld)
	}
	return AsUnavailable(r.p.errorf("redlock refresh: reached %d of %d nodes (quorum %d): %w", ok, n, r.q, firstErr(res)))
}

// Release implements driver.Locker: ReleaseScript on every node. It
// succeeds if a quorum of nodes released; ErrNotHeld if too few nodes held
// the lock for a quorum even counting the ones that failed (copies left on
// a minority are deleted all the same); otherwise an error naming the
// counts and the first node error.
func (r *Redlock) Release(ctx context.Context, key, owner string) error {
	if err := r.check(ctx, key, owner, 0, false, true); err != nil {
		return err
	}
	lock := LockKey(r.o.Prefix, key)
	ch := lock
	res := r.each(ctx, ReleaseScript, lockAndQueue(lock), owner, ch, WakeChannel(r.o.Prefix, ""))
	released, failed := 0, 0
	for _, x := range res {
		if x.err != nil {
			failed++
			continue
		}
		if v, _ := asInt(x.v); v == 1 {
			released++
		}
	}
	// Like a grant or a refresh, a release counts only on a quorum: a former
	// holder whose lock lingers on a minority of nodes (set a moment later
	// there, so expiring a moment later) did not hold it, and must hear
	// ErrNotHeld, though its leftovers are deleted all the same.
	switch {
	case released >= r.q:
		return nil
	case ctx.Err() != nil:
		return r.p.errorf("redlock release: %w", ctx.Err())
	case released+failed >= r.q:
		return AsUnavailable(r.p.errorf("redlock release: released on %d, %d of %d nodes failed (quorum %d): %w",
			released, failed, len(r.conns), r.q, firstErr(res)))
	}
	return r.p.errorf("redlock release: held on %d of %d nodes (quorum %d): %w",
		released, len(r.conns), r.q, driver.ErrNotHeld)
}

// Inspect implements driver.Inspector: the holder is the owner found on a
// quorum of nodes; Remaining is when that quorum ends (the quorum-th largest
// PTTL); Token the largest token seen for it. ErrNotHeld if no owner holds a
// quorum and enough nodes answered to know it.
func (r *Redlock) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := r.check(ctx, key, "", 0, false, false); err != nil {
		return driver.Info{}, err
	}
	lock := LockKey(r.o.Prefix, key)
	res := r.each(ctx, InspectScript, []string{lock})
	byOwner := map[string][]driver.Info{}
	failed := 0
	for _, x := range res {
		if x.err != nil {
			failed++
			continue
		}
		if info, err := r.p.parseInfo(x.v); err == nil {
			byOwner[info.Owner] = append(byOwner[info.Owner], info)
		}
	}
	for owner, infos := range byOwner {
		if len(infos) < r.q {
			continue
		}
		slices.SortFunc(infos, func(a, b driver.Info) int { return cmp.Compare(b.Remaining, a.Remaining) })
		out := driver.Info{Owner: owner, Remaining: infos[r.q-1].Remaining}
		for _, in := range infos {
			out.Token = max(out.Token, in.Token)
		}
		return out, nil
	}
	if ctx.Err() != nil {
		return driver.Info{}, r.p.errorf("redlock inspect: %w", ctx.Err())
	}
	if failed > 0 {
		best := 0
		for _, infos := range byOwner {
			best = max(best, len(infos))
		}
		if best+failed >= r.q {
			return driver.Info{}, r.p.errorf("redlock inspect: %d of %d nodes failed: %w", failed, len(r.conns), firstErr(res))
		}
	}
	return driver.Info{}, r.p.errorf("redlock inspect: %w", driver.ErrNotHeld)
}

// Ping implements driver.Pinger: it succeeds when a quorum of nodes answers
// within NodeTimeout.
func (r *Redlock) Ping(ctx context.Context) error {
	if r.closed.Load() {
		return r.p.errorf("%w", driver.ErrClosed)
	}
	ch := make(chan error, len(r.conns))
	pctx, cancel := context.WithTimeout(ctx, r.o.NodeTimeout)
	defer cancel()
	for _, c := range r.conns {
		go func() { ch <- c.Ping(pctx) }()
	}
	ok := 0
	var first error
	for range r.conns {
		var err error
		select {
		case err = <-ch:
		case <-pctx.Done():
			err = pctx.Err()
		}
		if err == nil {
			ok++
		} else if first == nil {
			first = err
		}
		if ok >= r.q {
			return nil
		}
		if pctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		return r.p.errorf("redlock ping: %w", ctx.Err())
	}
	return AsUnavailable(r.p.errorf("redlock ping: %d of %d nodes answered (quorum %d): %w", ok, len(r.conns), r.q, first))
}

// Close gives acquires in flight and the clean-ups of abandoned acquires up
// to a second, then closes every Conn. It is idempotent; later calls of
// every method return driver.ErrClosed.
func (r *Redlock) Close() error {
	r.closeMu.Lock()
	already := r.closed.Swap(true)
	r.closeMu.Unlock()
	if already {
		return nil
	}
	idle := make(chan struct{})
	go func() {
		r.bg.Wait()
		close(idle)
	}()
	t := time.NewTimer(time.Second)
	select {
	case <-idle:
	case <-t.C:
	}
	t.Stop()
	var errs []error
	for _, c := range r.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// lockAndQueue returns the keys ReleaseScript and CleanupScript take. A
// Redlock never queues, so the queue keys stay empty on its nodes.
func lockAndQueue(lock string) []string {
	ql, qz := QueueKeys(lock)
	return []string{lock, ql, qz}
}

// enter registers an acquire that Close waits for, with its clean-ups (see
// background); exit ends it. ok is false once Close has begun.
func (r *Redlock) enter() (exit func(), ok bool) {
	r.closeMu.Lock()
	defer r.closeMu.Unlock()
	if r.closed.Load() {
		return nil, false
	}
	r.bg.Add(1)
	return r.bg.Done, true
}

// background runs fn, a clean-up of an acquire, in its own goroutine; Close
// waits for it (up to a second). It is called only inside an entered
// acquire, so the count is never zero when it is raised.
func (r *Redlock) background(fn func()) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		fn()
	}()
}
