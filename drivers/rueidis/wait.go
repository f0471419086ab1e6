package rueidis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/internal/rediscore"
)

// Waiting. A Locker built by Open or NewWithClientOption owns its clients
// and sets their OnInvalidations hook, so it waits on client-side-caching
// invalidations of the lock key, as rueidislock does. Its watch client's
// connection runs CLIENT TRACKING ON OPTOUT, so every key it reads is
// tracked: reading the lock key (a DoCache GET, or the acquire script's own
// GET when an acquire attempt runs there) makes the server push an
// invalidation the moment the key is deleted, expires or is overwritten.
// Tracking is one-shot: after an invalidation the key must be read again. A Locker adopting a user's
// client (New) cannot set that hook, so it subscribes to the key's channel,
// on which the release script publishes.
//
// Either way the local subscribers of one key share one server-side watch
// through a rediscore.Hub, so a release costs the server O(1) work per
// process however many goroutines wait. The Hub channel is the lock key
// itself for client-side caching, and the pub/sub channel otherwise (they
// are the same string, see rediscore.Keys).

// cacheTTL is how long the client-side cache keeps the value read to arm a
// watch. The entry is read with a static TTL (no PTTL clamp), so it lives
// until the server invalidates it or cacheTTL passes: while it is cached
// the key is known to be tracked, and arming again costs no round trip.
const cacheTTL = 10 * time.Minute

// rearmTimeout bounds the re-arming read after an invalidation.
const rearmTimeout = 5 * time.Second

// rearmGrace is how long, after an invalidation, a single-node watch waits
// for an acquire attempt to re-arm it (see conn.Run) before re-arming with a
// read of its own. Package locker retries at once, so the read is rarely
// needed; a subscriber that does not retry gets it after rearmGrace.
const rearmGrace = 20 * time.Millisecond

// cscWaiter and pubsubWaiter are the two waiting strategies: each is the
// Locker's rediscore.Waiter.
var (
	_ rediscore.Waiter = (*cscWaiter)(nil)
	_ rediscore.Waiter = (*pubsubWaiter)(nil)
)

// cscWaiter waits on client-side-caching invalidations.
type cscWaiter struct {
	hub     *rediscore.Hub
	clients []rueidis.Client // the watch clients; set before the first Subscribe
	masters []*master        // Redlock: the watch clients are the connected masters'
	perNode time.Duration    // bound on each node's read when len(clients) > 1
	// piggyback: acquire attempts re-arm the watch (one node, not a
	// Cluster), so the re-arming read is deferred by rearmGrace.
	piggyback bool
	// hold, when set, also gets every invalidation (hold watching).
	hold *rediscore.HoldWatch

	mu     sync.Mutex
	keys   map[string]*watch // lock keys with local subscribers
	closed bool
	wg     sync.WaitGroup
}

// watch is the tracking state of one lock key.
type watch struct {
	epoch    uint64 // bumped by every invalidation
	armed    bool   // the server tracks the key for us (as of epoch)
	rearming bool   // a re-arm is scheduled or running
	again    bool   // an invalidation arrived during the re-arm
}

func newCSCWaiter() *cscWaiter {
	w := &cscWaiter{keys: map[string]*watch{}}
	w.hub = rediscore.NewHub(w.subscribe, w.unsubscribe).Named(Scheme)
	return w
}

// subscribe is the Hub's subscribe: arm the watch of lock; if the key is
// free already, wake its subscribers.
func (w *cscWaiter) subscribe(ctx context.Context, lock string) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return rediscore.ErrHubClosed
	}
	x := w.keys[lock]
	if x == nil {
		x = &watch{}
		w.keys[lock] = x
	}
	epoch := x.epoch
	w.mu.Unlock()
	free, err := w.arm(ctx, lock)
	if err != nil {
		return err
	}
	w.setArmed(lock, x, epoch)
	if free {
		w.hub.Wake(lock)
	}
	return nil
}

// unsubscribe is the Hub's unsubscribe (called with the Hub's lock held).
// The server keeps tracking the key until it next changes; that costs one
// push message at most.
func (w *cscWaiter) unsubscribe(lock string) {
	w.mu.Lock()
	delete(w.keys, lock)
	w.mu.Unlock()
}

// setArmed records that a read sent at epoch made the server track lock,
// unless an invalidation arrived since (then the tracking is gone again).
func (w *cscWaiter) setArmed(lock string, x *watch, epoch uint64) {
	w.mu.Lock()
	if w.keys[lock] == x && x.epoch == epoch {
		x.armed = true
	}
	w.mu.Unlock()
}

// wantsArm reports whether lock has local subscribers and is not tracked;
// conn.Run then sends the acquire attempt on the tracking connection, which
// tracks the key again as a side effect of the script's read. done must be
// called with whether the attempt reached the server.
func (w *cscWaiter) wantsArm(lock string) (done func(ok bool), want bool) {
	if w == nil || !w.piggyback {
		return nil, false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	x := w.keys[lock]
	if x == nil || x.armed || w.closed {
		return nil, false
	}
	epoch := x.epoch
	return func(ok bool) {
		if ok {
			w.setArmed(lock, x, epoch)
		}
	}, true
}

// invalidateHold tells the hold watch, if any, that lock may have changed.
func (w *cscWaiter) invalidateHold(lock string) {
	if w.hold != nil {
		w.hold.Invalidate(lock)
	}
}

// onInvalidations is the watch clients' OnInvalidations hook. It runs on a
// rueidis reading goroutine, so it never blocks: it wakes the key's
// subscribers and schedules a re-arm. A nil batch means the connection was
// lost (or the server flushed everything): every watch is woken and
// re-armed.
func (w *cscWaiter) onInvalidations(msgs []rueidis.RedisMessage) {
	if w.hold != nil {
		if msgs == nil {
			w.hold.Reset()
		} else {
			keys := make([]string, 0, len(msgs))
			for i := range msgs {
				if k, err := msgs[i].ToString(); err == nil {
					keys = append(keys, k)
				}
			}
			w.hold.Invalidate(keys...)
		}
	}
	var woken []string
	w.mu.Lock()
	if w.closed || len(w.keys) == 0 {
		w.mu.Unlock()
		return
	}
	if msgs == nil {
		for k, x := range w.keys {
			woken = append(woken, k)
			w.invalidateLocked(k, x, 0)
		}
	} else {
		grace := time.Duration(0)
		if w.piggyback {
			grace = rearmGrace
		}
		for i := range msgs {
			k, err := msgs[i].ToString()
			if err != nil {
				continue
			}
			if x := w.keys[k]; x != nil {
				woken = append(woken, k)
				w.invalidateLocked(k, x, grace)
			}
		}
	}
	w.mu.Unlock()
	for _, k := range woken {
		w.hub.Wake(k)
	}
}

func (w *cscWaiter) invalidateLocked(lock string, x *watch, grace time.Duration) {
	x.epoch++
	x.armed = false
	if x.rearming {
		x.again = true
		return
	}
	x.rearming = true
	w.wg.Add(1)
	if grace > 0 {
		time.AfterFunc(grace, func() { w.rearm(lock, x) })
	} else {
		go w.rearm(lock, x)
	}
}

// rearm reads the key again so the server tracks it again (tracking is
// one-shot), unless an acquire attempt did so meanwhile. A change between
// the invalidation and this read is caught by the read itself: a free key
// wakes the subscribers.
func (w *cscWaiter) rearm(lock string, x *watch) {
	defer w.wg.Done()
	for {
		w.mu.Lock()
		x.again = false
		if x.armed || w.keys[lock] != x || w.closed {
			x.rearming = false
			w.mu.Unlock()
			return
		}
		epoch := x.epoch
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), rearmTimeout)
		free, err := w.arm(ctx, lock)
		cancel()
		if err == nil {
			w.setArmed(lock, x, epoch)
		}
		if free || err != nil {
			w.hub.Wake(lock)
		}
		w.mu.Lock()
		if x.again && w.keys[lock] == x && !w.closed {
			w.mu.Unlock()
			continue
		}
		x.rearming = false
		w.mu.Unlock()
		return
	}
}

// arm makes sure every node tracks lock for this process and reports
// whether the key looked free on one of them. With one node a cached value
// means the watch is armed already and costs nothing. With several
// (Redlock) it succeeds if at least one node armed.
func (w *cscWaiter) arm(ctx context.Context, lock string) (free bool, err error) {
	clients := w.clients
	if w.masters != nil {
		if clients = masterClients(w.masters); len(clients) == 0 {
			return false, fmt.Errorf("rueidis: watch %s: no Redlock master connected", lock)
		}
	}
	if len(clients) == 1 {
		return armOne(ctx, clients[0], lock)
	}
	type res struct {
		free bool
		err  error
	}
	out := make(chan res, len(clients))
	for _, c := range clients {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, w.perNode)
			defer cancel()
			f, err := armOne(nctx, c, lock)
			out <- res{f, err}
		}()
	}
	armed := 0
	for range clients {
		r := <-out
		if r.err != nil {
			err = r.err
			continue
		}
		armed++
		free = free || r.free
	}
	if armed > 0 {
		return free, nil
	}
	if cerr := ctx.Err(); cerr != nil {
		return false, fmt.Errorf("rueidis: watch %s: %w", lock, cerr)
	}
	return false, err
}

// armOne reads lock on a tracking connection (DoCache with a static TTL:
// ECHO + GET in OPTOUT mode, or nothing while the value is still cached).
func armOne(ctx context.Context, c rueidis.Client, lock string) (free bool, err error) {
	// Pinned: see doFunc.
	err = c.DoCache(ctx, c.B().Get().Key(lock).Cache().ToStaticTTL().Pin(), cacheTTL).Error()
	switch {
	case err == nil:
		return false, nil
	case rueidis.IsRedisNil(err):
		return true, nil
	case ctx.Err() != nil:
		return false, fmt.Errorf("rueidis: watch %s: %w (%v)", lock, ctx.Err(), err)
	default:
		return false, fmt.Errorf("rueidis: watch %s: %w", lock, err)
	}
}

// Subscribe arms (or shares) the watch of lock.
func (w *cscWaiter) Subscribe(ctx context.Context, lock, _ string) (<-chan struct{}, func(), error) {
	return w.hub.Wait(ctx, lock)
}

// Shut ends every watch; the clients are closed by the Conns, before.
func (w *cscWaiter) Shut() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.hub.Close()
	w.wg.Wait()
}

// pubsubWaiter waits on the key's pub/sub channel; used with adopted
// clients, whose invalidation hook belongs to their owner. Each channel
// with local subscribers has one goroutine per client (per Redlock master)
// blocked in client.Receive.
type pubsubWaiter struct {
	hub     *rediscore.Hub
	clients []rueidis.Client
	perNode time.Duration // with several clients: how long to wait for more confirmations

	mu     sync.Mutex
	subs   map[string]context.CancelFunc
	closed bool
	wg     sync.WaitGroup
}

func newPubSubWaiter(clients []rueidis.Client, perNode time.Duration) *pubsubWaiter {
	w := &pubsubWaiter{clients: clients, perNode: perNode, subs: map[string]context.CancelFunc{}}
	w.hub = rediscore.NewHub(w.subscribe, w.unsubscribe).Named(Scheme)
	return w
}

// Subscribe subscribes to (or shares the subscription of) channel.
func (w *pubsubWaiter) Subscribe(ctx context.Context, _, channel string) (<-chan struct{}, func(), error) {
	return w.hub.Wait(ctx, channel)
}

// subscribe is the Hub's subscribe: start the channel's Receive loops and
// wait for the server's confirmation: from the single client, or with
// several (Redlock) from all of them, or from at least one once perNode has
// passed.
func (w *pubsubWaiter) subscribe(ctx context.Context, channel string) error {
	rctx, cancel := context.WithCancel(context.Background())
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		cancel()
		return rediscore.ErrHubClosed
	}
	if prev := w.subs[channel]; prev != nil {
		prev()
	}
	w.subs[channel] = cancel
	w.wg.Add(len(w.clients))
	w.mu.Unlock()
	settled := make(chan error, len(w.clients))
	for _, c := range w.clients {
		go w.run(rctx, c, channel, settled)
	}
	var grace <-chan time.Time
	ok := 0
	var last error
	for range w.clients {
		select {
		case err := <-settled:
			if err != nil {
				last = err
				continue
			}
			ok++
			if ok == 1 && len(w.clients) > 1 {
				t := time.NewTimer(w.perNode)
				defer t.Stop()
				grace = t.C
			}
		case <-grace:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("rueidis: subscribe %s: %w", channel, ctx.Err())
		}
	}
	if ok == 0 {
		return last
	}
	return nil
}

// unsubscribe is the Hub's unsubscribe: stop the Receive loops (each sends
// UNSUBSCRIBE on its way out). It does not block.
func (w *pubsubWaiter) unsubscribe(channel string) {
	w.mu.Lock()
	if cancel := w.subs[channel]; cancel != nil {
		cancel()
		delete(w.subs, channel)
	}
	w.mu.Unlock()
}

// run keeps channel's SUBSCRIBE on client alive until ctx is done, waking
// the channel's subscribers on every message and after every
// resubscription (see receive).
func (w *pubsubWaiter) run(ctx context.Context, client rueidis.Client, channel string, settled chan<- error) {
	defer w.wg.Done()
	wake := func(string) { w.hub.Wake(channel) }
	receive(ctx, client, channel, settled, wake, func() { w.hub.Wake(channel) })
}

// receive keeps channel's SUBSCRIBE on client alive until ctx is done.
// settled receives nil on the first confirmation, or the first failure
// before any. msg gets each message's payload. After a lost connection (or
// a stray UNSUBSCRIBE) it subscribes again and then calls resub, since a
// message may have been missed.
func receive(ctx context.Context, client rueidis.Client, channel string, settled chan<- error, msg func(string), resub func()) {
	var once sync.Once
	settle := func(err error) { once.Do(func() { settled <- err }) }
	defer settle(rediscore.ErrHubClosed)
	var confirmed atomic.Bool
	delay := 10 * time.Millisecond
	for ctx.Err() == nil {
		hctx := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
			if s.Kind != "subscribe" || s.Channel != channel {
				return
			}
			if confirmed.Swap(true) {
				resub() // subscribed again after a reconnection
			}
			settle(nil)
		})
		hctx = rueidis.WithOnReceiveReturnHook(hctx, func(err error, c rueidis.CommandClient) error {
			if ctx.Err() != nil {
				uctx, cancel := context.WithTimeout(context.Background(), time.Second)
				c.Do(uctx, c.B().Unsubscribe().Channel(channel).Build())
				cancel()
			}
			return err
		})
		// A fresh command each time: rueidis recycles a command once it
		// has been sent.
		sub := client.B().Subscribe().Channel(channel).Build()
		err := client.Receive(hctx, sub, func(m rueidis.PubSubMessage) { msg(m.Message) })
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			settle(fmt.Errorf("rueidis: subscribe %s: %w", channel, err))
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// Shut ends every subscription. The adopted clients stay open.
func (w *pubsubWaiter) Shut() {
	w.mu.Lock()
	w.closed = true
	for ch, cancel := range w.subs {
		cancel()
		delete(w.subs, ch)
	}
	w.mu.Unlock()
	w.hub.Close()
	w.wg.Wait()
}
