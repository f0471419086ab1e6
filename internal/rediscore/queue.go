package rediscore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// The fair queue. A waiting Acquire on a Node (single node, Cluster or
// Sentinel) joins a FIFO queue kept on the server beside the lock, in the
// lock's hash slot:
//
//	<lock>:q   a list of waiters in arrival order
//	<lock>:qt  a sorted set of the same waiters, scored by when their
//	           entry expires (server time in ms)
//
// A waiter is the element "<wid>:<owner>", where wid names the Node (one
// random id per Node) and so its wake channel, WakeChannel(prefix, wid).
// A release (ReleaseScript) or an abandoned grant (CleanupScript) hands the
// lock to the first waiter whose entry is alive and whose Node still
// listens (PUBLISH on its wake channel reached a subscriber): the lock key
// becomes the reservation "q:<element>", which nobody else can take, for
// at most the rest of that entry's life. The waiter's next
// QueueAcquireScript turns the reservation into a grant with a fresh
// fencing token. Nobody else is woken: a handoff costs the server O(1)
// commands however many processes wait.
//
// A Node joins the queue only once its wake channel is subscribed (its
// first wait probes without joining, then subscribes), so an element
// nobody listens for belongs to a waiter whose process exited or whose
// connection dropped, and is skipped at once. On a Cluster PUBLISH counts
// only the subscribers of one node, and a Node that could not subscribe
// has nobody listening either: their elements are "~<wid>:<owner>", never
// skipped for want of a listener.
//
// The first waiter in line looks again when the holder's TTL would run
// out (the PTTL its attempt returned), so a holder that crashed is taken
// over right after its TTL. A waiter that becomes first without a wake-up
// (the one before it was granted the lock, left, or was dropped) is sent
// a nudge, "{<ms>}<lock>" on its wake channel, with the holder's time
// left, and re-arms its timer without a round trip; so is the first
// waiter when its holder refreshes to a shorter TTL (RefreshScript).
//
// Entries live QueueTTL unless renewed; a waiter renews its entry every
// QueueTTL/2 by running QueueAcquireScript again (which also joins again,
// at the back, a waiter that was skipped). A waiter that was cut off stops
// renewing: its entry, and a reservation made for it, lapse within
// QueueTTL, and the waiter behind it, whose timer is set to that moment,
// drops it and goes on. A wait that ends for any other reason (its ctx
// ended, its Node was closed, an error) removes its entry at once
// (LeaveScript) and passes on a reservation it was given.
//
// Acquire (one attempt, TryAcquire) does not queue: it takes a free key,
// and a free key with waiters is rare, since a release hands it over
// rather than freeing it. It is free only after a holder's TTL ran out
// (the head of the queue is woken at that moment by its own timer) or a
// reservation lapsed.

// MinQueueTTL is the shortest Options.QueueTTL accepted.
const MinQueueTTL = 30 * time.Millisecond

// QueueKeys returns the fair queue's keys for a lock key (see Keys): the
// list of waiters and the sorted set of their expiries. They share the
// lock's hash tag, hence its Cluster slot.
func QueueKeys(lock string) (list, expiries string) {
	return lock + ":q", lock + ":qt"
}

// WakeChannel returns the pub/sub channel on which the Node with id wid is
// told that a lock was handed to one of its waiters; the message is the
// lock key.
func WakeChannel(prefix, wid string) string {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return prefix + ":wake:" + wid
}

// QueueAcquireScript is one attempt of a queued waiter: it takes the lock
// if it is reserved for the waiter, or free with the waiter first in line
// (or nobody in line); otherwise it adds the waiter to the queue or renews
// its entry. Entries that expired at the head of the queue are dropped
// first; if that leaves the lock free with another waiter first, the lock
// is reserved for the first live one (see reserveLua) and it is woken (it
// may have missed its wake-up); if every waiter before this one is gone,
// this one takes the lock.
//
//	KEYS[1] lock key, KEYS[2] token counter key, KEYS[3] queue list,
//	KEYS[4] queue expiries
//	ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] counter retention in ms,
//	ARGV[4] element "<wid>:<owner>" (or "~<wid>:<owner>"),
//	ARGV[5] QueueTTL in ms, ARGV[6] wake channel prefix ("<prefix>:wake:"),
//	ARGV[7] "1" to join the queue, "0" to take a free lock only (the
//	Node's wake channel is not subscribed yet)
//
// Reply: as AcquireScript's for a grant (a bulk string token when created,
// {token} when owner held the lock already); when queued, an integer: the
// milliseconds after which the waiter should look again even if not woken
// (the holder's PTTL when it is first in line, else the first entry's
// remaining life); when not joining, the lock's PTTL.
var QueueAcquireScript = newScript("queue-acquire", grantLua+reserveLua+`
local v = redis.call('GET', KEYS[1])
local el = ARGV[4]
if v and string.sub(v, 1, 2) ~= 'q:' then
  local i = string.find(v, ':', 1, true)
  if i and string.sub(v, i + 1) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    redis.call('ZREM', KEYS[4], el)
    redis.call('LREM', KEYS[3], 1, el)
    return {string.sub(v, 1, i - 1)}
  end
end
local t = redis.call('TIME')
local now = millis(t)
local head = redis.call('LINDEX', KEYS[3], 0)
local e
local dropped = false
while head do
  e = tonumber(redis.call('ZSCORE', KEYS[4], head))
  if e and e > now then break end
  redis.call('LPOP', KEYS[3])
  redis.call('ZREM', KEYS[4], head)
  dropped = true
  if v == 'q:' .. head then
    redis.call('DEL', KEYS[1])
    v = nil
  end
  head = redis.call('LINDEX', KEYS[3], 0)
end
local function take()
  redis.call('ZREM', KEYS[4], el)
  redis.call('LREM', KEYS[3], 1, el)
  local tok = grant(t)
  nudge(KEYS[3], ARGV[6], ARGV[2])
  return tok
end
if v == 'q:' .. el or (not v and (not head or head == el)) then
  if head then return take() end
  return grant(t)
end
if dropped and head and head ~= el and v and string.sub(v, 1, 2) ~= 'q:' then
  nudge(KEYS[3], ARGV[6], redis.call('PTTL', KEYS[1]))
end
if ARGV[7] ~= '1' then
  return redis.call('PTTL', KEYS[1])
end
local life = tonumber(ARGV[5])
if redis.call('ZADD', KEYS[4], now + life, el) == 1 then
  redis.call('RPUSH', KEYS[3], el)
end
redis.call('PEXPIRE', KEYS[3], 2 * life)
redis.call('PEXPIRE', KEYS[4], 2 * life)
if not head or head == el then
  return redis.call('PTTL', KEYS[1])
end
if not v then
  local who, left = reserve(now, head, KEYS[3], KEYS[4], ARGV[6], el)
  if who == 'self' then return take() end
  return left
end
return e - now
`)

// LeaveScript takes a waiter out of the queue (a cancelled or failed
// wait). If the lock was reserved for it, the reservation goes to the next
// live waiter, or the lock is freed (see ReleaseScript). If it was first in
// line, the new first waiter is given a free lock (see reserveLua) or told
// how long the holder has left (nudge).
//
//	KEYS[1] lock key, KEYS[2] queue list, KEYS[3] queue expiries
//	ARGV[1] element, ARGV[2] the key's channel, ARGV[3] wake channel prefix
//
// Reply: 1 when a reservation was passed on, else 0.
var LeaveScript = newScript("leave", handoffLua+`
local first = redis.call('LINDEX', KEYS[2], 0) == ARGV[1]
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('LREM', KEYS[2], 1, ARGV[1])
local v = redis.call('GET', KEYS[1])
if v == 'q:' .. ARGV[1] then
  handoff()
  return 1
end
if first then
  if not v then
    local h = redis.call('LINDEX', KEYS[2], 0)
    if h then
      reserve(millis(redis.call('TIME')), h, KEYS[2], KEYS[3], ARGV[3], nil)
    end
  elseif string.sub(v, 1, 2) ~= 'q:' then
    local p = redis.call('PTTL', KEYS[1])
    if p > 0 then nudge(KEYS[2], ARGV[3], p) end
  end
end
return 0
`)

// Listener is what a driver adapter supplies for the fair queue's
// wake-ups: one pub/sub subscription that lives as long as the Node.
type Listener interface {
	// Listen subscribes to channel and returns once the server confirmed
	// the subscription, or with an error (wrapping ctx.Err() once ctx is
	// done; ctx bounds only the wait for the confirmation). From then on,
	// until the Node is closed, msg is called with the payload of every
	// message on channel, and with "" each time the subscription was
	// re-established after a lost connection (messages may have been
	// missed). msg must not block.
	Listen(ctx context.Context, channel string, msg func(payload string)) error
}

// newWID returns a random Node id for queue elements and the wake channel.
func newWID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// router hands wake-ups to the Node's waiting calls by lock key.
type router struct {
	mu    sync.Mutex
	byKey map[string]*waitSet
}

type waitSet struct{ waiters map[*queueWaiter]struct{} }

// queueWaiter is what one waiting call receives: wake (look again now) and
// rearm (look again after this long, unless sooner anyway).
type queueWaiter struct {
	wake  chan struct{}
	rearm chan time.Duration
}

func newQueueWaiter() *queueWaiter {
	return &queueWaiter{wake: make(chan struct{}, 1), rearm: make(chan time.Duration, 1)}
}

func (r *router) add(lock string, q *queueWaiter) (remove func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byKey == nil {
		r.byKey = map[string]*waitSet{}
	}
	w := r.byKey[lock]
	if w == nil {
		w = &waitSet{waiters: map[*queueWaiter]struct{}{}}
		r.byKey[lock] = w
	}
	w.waiters[q] = struct{}{}
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(w.waiters, q)
		if len(w.waiters) == 0 && r.byKey[lock] == w {
			delete(r.byKey, lock)
		}
	}
}

// deliver handles a message of the wake channel: "<lock>" wakes the
// waiters of lock, "{<ms>}<lock>" (nudge, see reserveLua) re-arms them to
// look again after ms, and "" (or a message it cannot read) wakes every
// waiter.
func (r *router) deliver(payload string) {
	lock, ms, nudged := parseWake(payload)
	var d time.Duration
	if nudged {
		d = time.Duration(ms)*time.Millisecond + expirySlack + mrand.N(expirySlack)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if lock == "" {
		for _, w := range r.byKey {
			for q := range w.waiters {
				notify(q.wake)
			}
		}
		return
	}
	w := r.byKey[lock]
	if w == nil {
		return
	}
	for q := range w.waiters {
		if !nudged {
			notify(q.wake)
			continue
		}
		select { // the latest hint replaces one not yet taken
		case <-q.rearm:
		default:
		}
		select {
		case q.rearm <- d:
		default:
		}
	}
}

// parseWake reads a wake channel message (see deliver). A lock key never
// starts with '{' (it starts with the prefix, which has no brace), and ms
// is digits, so the first '}' ends it: the split holds whatever bytes the
// key holds. lock is "" for "" and for a malformed nudge.
func parseWake(payload string) (lock string, ms int64, nudged bool) {
	rest, ok := strings.CutPrefix(payload, "{")
	if !ok {
		return payload, 0, false
	}
	hint, lock, ok := strings.Cut(rest, "}")
	n, err := strconv.ParseInt(hint, 10, 64)
	if !ok || err != nil || n < 0 || lock == "" {
		return "", 0, false
	}
	return lock, n, true
}

// SetListener turns the fair queue on for n's waiting acquires
// (AcquireWait), unless n's options say Barging. Call it before n is used.
func (n *Node) SetListener(l Listener) { n.listener = l }

// Queued reports whether AcquireWait queues (a Listener is set and the
// options do not say Barging).
func (n *Node) Queued() bool { return n.listener != nil && !n.o.Barging }

// listen subscribes n's wake channel once; concurrent callers wait for the
// first. It reports whether the subscription is up.
func (n *Node) listen(ctx context.Context) error {
	n.listenMu.Lock()
	defer n.listenMu.Unlock()
	if n.listening.Load() {
		return nil
	}
	if err := n.listener.Listen(ctx, WakeChannel(n.o.Prefix, n.wid), n.route.deliver); err != nil {
		return err
	}
	n.listening.Store(true)
	return nil
}

// Waiting policy of AcquireWait.
const (
	// retryMin and retryMax bound the backoff after a transient error.
	retryMin = 5 * time.Millisecond
	retryMax = 500 * time.Millisecond
	// fallbackWait caps a barging wait for a notification.
	fallbackWait = 2 * time.Second
	// expirySlack is added to a reported PTTL so the retry lands just
	// after the server expired the key.
	expirySlack = 2 * time.Millisecond
)

// AcquireWait implements driver.BlockingAcquirer: it waits until key is
// granted to owner, queued on the server in arrival order (see the fair
// queue above) when Queued, else barging (see bargeWait, with subscribe
// for wake-ups). The uncontended path is one round trip; the first wait
// of a Node costs one more (it subscribes the wake channel between a
// first attempt that does not join and one that does). ctx bounds the
// wait; when it ends the call returns an error wrapping ctx.Err() (and the
// last transient error, if any) and, in the background, leaves the queue
// and frees a grant made meanwhile. Close ends the wait with
// driver.ErrClosed, once it has left the queue (and freed a grant made
// meanwhile), before the Conn closes. The first attempt's error is
// returned at once; later transient errors (ErrUnavailable, a dropped
// connection) are retried with backoff. Errors: driver.ErrInvalid for bad
// arguments, driver.ErrClosed after Close.
func (n *Node) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration, subscribe func(context.Context) (<-chan struct{}, func(), error)) (uint64, error) {
	if !n.Queued() {
		return n.p.bargeWait(ctx, func(ctx context.Context) (uint64, error) { return n.Acquire(ctx, key, owner, ttl) }, subscribe)
	}
	if err := n.check(ctx, key, owner, ttl, true, true); err != nil {
		return 0, err
	}
	exit, ok := n.enter()
	if !ok {
		return 0, n.p.errorf("acquire: %w", driver.ErrClosed)
	}
	defer exit()
	w := n.newQueuedWait(key, owner, ttl)
	defer n.route.add(w.lock, w.q)()
	return w.run(ctx)
}

// waitSpec is what a queued wait runs: the mutex's (QueueAcquireScript)
// or a shared hold's (SharedAcquireScript).
type waitSpec struct {
	script *Script
	// parse reads the script's reply as a grant.
	parse func(v any, err error) grant
	// leave takes the waiter out of the queue and frees g if the attempt
	// whose outcome it is created it.
	leave func(g grant)
	// sync makes a wait that its ctx ended leave the queue before it
	// returns (bounded by QueueTTL), rather than in the background.
	sync bool
}

// queuedWait is one AcquireWait (or a waiting AcquireShared) on the fair
// queue.
type queuedWait struct {
	waitSpec
	n                     *Node
	owner, lock, ch, wake string // wake: the wake channel prefix
	keys                  []string
	// args are QueueAcquireScript's: args[3] is the element, args[6] says
	// whether to join.
	args    []string
	join    bool
	q       *queueWaiter
	retry   time.Duration
	lastErr error
}

func (n *Node) newQueuedWait(key, owner string, ttl time.Duration) *queuedWait {
	lock, counter, ch := Keys(n.o.Prefix, key)
	ql, qz := QueueKeys(lock)
	w := &queuedWait{n: n, owner: owner, lock: lock, ch: ch, wake: WakeChannel(n.o.Prefix, ""),
		keys: []string{lock, counter, ql, qz}, q: newQueueWaiter(), retry: retryMin}
	w.args = []string{owner, ttlMS(n.Capabilities(), ttl), n.retMS, "", strconv.FormatInt(n.o.QueueTTL.Milliseconds(), 10), w.wake, "0"}
	w.waitSpec = waitSpec{script: QueueAcquireScript, parse: n.p.parseGrant, leave: w.leaveMutex}
	w.setElement()
	if n.listening.Load() {
		w.setJoin()
	}
	return w
}

// setElement sets the element: "<wid>:<owner>" when the Node's wake
// channel is subscribed and PUBLISH counts its subscribers (not a
// Cluster), so that a release skips the entry once nobody listens;
// "~<wid>:<owner>" otherwise. Until the channel is subscribed, attempts do
// not join the queue; the element is fixed by the first attempt that does.
func (w *queuedWait) setElement() {
	if w.n.listening.Load() && !w.n.sharded {
		w.args[3] = w.n.wid + ":" + w.owner
	} else {
		w.args[3] = "~" + w.n.wid + ":" + w.owner
	}
}

func (w *queuedWait) setJoin() {
	w.join = true
	w.args[6] = "1"
}

// leaveMutex takes the waiter out of the mutex's queue, passing on a
// reservation made for it, and frees g if the attempt whose outcome it is
// created it.
func (w *queuedWait) leaveMutex(g grant) {
	n := w.n
	if g.kind == grantCreated {
		n.cleanup(w.lock, w.ch, w.owner, g.token)
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(n.detachedTimeout(), n.o.QueueTTL))
	defer cancel()
	ql, qz := w.keys[2], w.keys[3]
	_, _ = n.c.Run(ctx, LeaveScript, []string{w.lock, ql, qz}, w.args[3], w.ch, w.wake)
}

// run is the waiting loop: an attempt, then a sleep until a wake-up, a
// nudge's moment, the timer, ctx's end or Close.
func (w *queuedWait) run(ctx context.Context) (uint64, error) {
	n := w.n
	for first := true; ; first = false {
		if n.closed.Load() {
			w.leave(grant{})
			return 0, n.p.errorf("acquire: %w", driver.ErrClosed)
		}
		drain(w.q.wake)
		drain(w.q.rearm)
		left := make(chan struct{})
		v, err, abandoned := n.runDetached(ctx, w.script, w.keys, w.args, func(g grant) {
			defer close(left)
			w.leave(g)
		})
		if abandoned {
			w.awaitLeft(left)
			return 0, n.p.waitErr(ctx, "acquire", w.lastErr)
		}
		g := w.parse(v, err)
		var wait time.Duration
		switch g.kind {
		case grantCreated, grantExisting:
			if n.closed.Load() { // granted while Close runs: nobody will use it
				w.leave(g)
				return 0, n.p.errorf("acquire: %w", driver.ErrClosed)
			}
			return g.token, nil
		case grantHeld:
			var again bool
			if wait, again, err = w.held(ctx, g); err != nil {
				return 0, err
			}
			if again {
				continue
			}
		default:
			if first || errors.Is(g.err, driver.ErrInvalid) || errors.Is(g.err, driver.ErrClosed) || n.closed.Load() {
				w.quit()
				return 0, n.p.ctxErr(ctx, "acquire", g.err)
			}
			w.lastErr = g.err
			wait = backoff(&w.retry)
		}
		switch sleep(ctx, w.q.wake, w.q.rearm, n.done, wait) {
		case ctxEnded:
			w.quit()
			return 0, n.p.waitErr(ctx, "acquire", w.lastErr)
		case closedDone:
			w.leave(grant{})
			return 0, n.p.errorf("acquire: %w", driver.ErrClosed)
		}
	}
}

// quit leaves the queue after a wait ended without a grant: at once when
// sync, else in the background.
func (w *queuedWait) quit() {
	if !w.sync {
		w.n.background(func() { w.leave(grant{}) })
		return
	}
	w.awaitLeft(nil)
}

// awaitLeft, when sync, waits until left is closed (a nil left: leaves the
// queue itself), for at most QueueTTL.
func (w *queuedWait) awaitLeft(left chan struct{}) {
	if !w.sync {
		return
	}
	if left == nil {
		w.leave(grant{})
		return
	}
	t := time.NewTimer(w.n.o.QueueTTL)
	defer t.Stop()
	select {
	case <-left:
	case <-t.C:
	}
}

// held handles an attempt that found the key held: it subscribes the wake
// channel first (again: look at once, a wake-up sent meanwhile was missed),
// then joins the queue (again), then returns how long to sleep: until the
// holder's TTL runs out if sooner than the heartbeat.
func (w *queuedWait) held(ctx context.Context, g grant) (wait time.Duration, again bool, err error) {
	n := w.n
	w.retry = retryMin
	if !n.listening.Load() && n.listener != nil {
		err := n.listen(ctx)
		if err != nil && ctx.Err() != nil {
			w.quit()
			return 0, false, n.p.waitErr(ctx, "acquire", w.lastErr)
		}
		if w.join && err == nil {
			return 0, true, nil
		}
		// Without a wake channel a queued waiter looks again at the
		// heartbeat.
	}
	if !w.join {
		w.setElement()
		w.setJoin()
		return 0, true, nil
	}
	wait = n.o.QueueTTL / 2
	if g.pttl > 0 && g.pttl+expirySlack < wait {
		wait = g.pttl + expirySlack + mrand.N(expirySlack)
	}
	return wait, false, nil
}

// runDetached runs s detached from ctx's cancellation. If ctx ends first it
// returns abandoned, and the outcome is handed to onAbandon in the
// background once known (a grant kind of grantUnknown when the reply was
// lost).
func (n *Node) runDetached(ctx context.Context, s *Script, keys, args []string, onAbandon func(grant)) (v any, err error, abandoned bool) {
	if ctx.Done() == nil {
		v, err = n.c.Run(ctx, s, keys, args...)
		return v, err, false
	}
	j := newJob(ctx, s, keys, args, true)
	n.start(j)
	select {
	case <-j.done:
		v, err = j.result()
		return v, err, false
	case <-ctx.Done():
		n.background(func() {
			<-j.done
			onAbandon(n.p.parseGrant(j.v, j.err))
		})
		return nil, nil, true
	}
}

// background runs f in a goroutine that Close waits for. Call it only
// between enter and its exit.
func (n *Node) background(f func()) {
	n.bg.Add(1)
	go func() {
		defer n.bg.Done()
		f()
	}()
}

// waitErr is the error of a wait that ctx ended.
func (p prefix) waitErr(ctx context.Context, op string, last error) error {
	if last != nil {
		return p.errorf("%s: %w (while waiting, last error: %w)", op, ctx.Err(), last)
	}
	return p.errorf("%s: %w", op, ctx.Err())
}

// bargeWait waits for a grant without a queue: it calls acquire, and while
// another owner holds the key waits for a wake-up from subscribe (started
// after the first refusal; nil means none) or the holder's reported PTTL,
// capped at 2s, then tries again; the fastest waiter wins, as with
// sync.Mutex. Errors as for Node.AcquireWait; they start with p.
func (p prefix) bargeWait(ctx context.Context, acquire func(context.Context) (uint64, error), subscribe func(context.Context) (<-chan struct{}, func(), error)) (uint64, error) {
	var (
		wake    <-chan struct{}
		lastErr error
	)
	retry := retryMin
	for first := true; ; first = false {
		drain(wake)
		tok, err := acquire(ctx)
		if err == nil {
			return tok, nil
		}
		var held *driver.HeldError
		wait := fallbackWait
		switch {
		case errors.As(err, &held):
			retry = retryMin
			if wake == nil && subscribe != nil {
				w, cancel, serr := subscribe(ctx)
				if serr == nil {
					defer cancel()
					wake = w
					continue // a release before the subscription was missed: look again
				}
				if ctx.Err() != nil {
					return 0, p.waitErr(ctx, "acquire", lastErr)
				}
			}
			if held.Remaining > 0 && held.Remaining+expirySlack < wait {
				wait = held.Remaining + expirySlack + mrand.N(expirySlack)
			}
		case errors.Is(err, driver.ErrNotAcquired):
			retry = retryMin
		case first, ctx.Err() != nil, errors.Is(err, driver.ErrInvalid), errors.Is(err, driver.ErrClosed):
			return 0, err
		default:
			lastErr = err
			wait = backoff(&retry)
		}
		if sleep(ctx, wake, nil, nil, wait) == ctxEnded {
			return 0, p.waitErr(ctx, "acquire", lastErr)
		}
	}
}

// How a sleep ended.
const (
	woken      = iota // by a wake-up or its timer
	ctxEnded          // the caller's ctx is done
	closedDone        // done was closed (the Node is closing)
)

// sleep waits d, or less if wake receives, ctx ends or done (nil: never)
// is closed; a duration received on rearm (nil: none) ends it that long
// after, if that is sooner.
func sleep(ctx context.Context, wake <-chan struct{}, rearm <-chan time.Duration, done <-chan struct{}, d time.Duration) int {
	t := time.NewTimer(d)
	defer t.Stop()
	until := time.Now().Add(d)
	for {
		select {
		case <-wake:
		case <-t.C:
		case r := <-rearm:
			if at := time.Now().Add(r); at.Before(until) {
				until = at
				t.Reset(r)
			}
			continue
		case <-ctx.Done():
			return ctxEnded
		case <-done:
			return closedDone
		}
		return woken
	}
}

// backoff returns the wait after a transient error, *retry jittered, and
// doubles *retry up to retryMax.
func backoff(retry *time.Duration) time.Duration {
	d := jitter(*retry)
	*retry = min(2**retry, retryMax)
	return d
}

// drain empties c of the values already in it.
func drain[T any](c <-chan T) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// jitter spreads d over [0.8d, 1.2d).
func jitter(d time.Duration) time.Duration {
	return d*8/10 + mrand.N(d*4/10+1)
}
