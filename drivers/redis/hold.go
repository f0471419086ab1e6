package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

// invalidateChannel is where the server sends the invalidations of a
// connection tracking with REDIRECT to a RESP2 subscriber.
const invalidateChannel = "__redis__:invalidate"

// trackerPing is how often the tracking connection is checked while the
// tracker runs: a tracking connection that broke and came back has lost
// its tracked keys, so every watched key is read again.
const trackerPing = time.Second

// tracker watches the holds of a go-redis Locker through one nodeTracker
// per server that holds lock keys: the single server or the Sentinel
// master, or each Cluster master, made when a watched key is first read
// there. All of them report to one HoldWatch.
type tracker struct {
	hold *rediscore.HoldWatch
	// newNode makes the nodeTracker of a server (addr is "" outside a
	// Cluster).
	newNode func(addr string) *nodeTracker
	// route names the Cluster master serving a lock key; nil outside a
	// Cluster.
	route func(ctx context.Context, lock string) (addr string, err error)

	// noloop: servers whose policy cannot evict a lock key (Open checked);
	// their tracking connections run with NOLOOP and the Locker's
	// refreshes run there (see refreshClient).
	noloop bool

	mu     sync.Mutex
	nodes  map[string]*nodeTracker
	closed bool
}

// newTracker returns the tracker of a single server or Sentinel master:
// newClient makes a one-connection client to it.
func newTracker(newClient func(func(context.Context, *redis.Conn) error, bool) *redis.Client, prefix string) *tracker {
	return newRoutedTracker(func(string) func(func(context.Context, *redis.Conn) error, bool) *redis.Client { return newClient }, nil, prefix)
}

// newRoutedTracker returns a tracker whose keys are read on the server
// route names (every key on one server when route is nil); clientFor(addr)
// makes one-connection clients to that server.
func newRoutedTracker(clientFor func(addr string) func(func(context.Context, *redis.Conn) error, bool) *redis.Client,
	route func(ctx context.Context, lock string) (string, error), prefix string) *tracker {
	t := &tracker{route: route, nodes: map[string]*nodeTracker{}}
	t.hold = rediscore.NewHoldWatch(t.read, prefix)
	t.hold.SetBatchReader(t.readBatch)
	t.newNode = func(addr string) *nodeTracker {
		return &nodeTracker{newClient: clientFor(addr), hold: t.hold, noloop: t.noloop, ready: make(chan struct{}), done: make(chan struct{})}
	}
	return t
}

// read is the HoldWatch's reader: GET of lock on the tracking connection
// of the server serving it.
func (t *tracker) read(ctx context.Context, lock string) (string, bool, error) {
	n, err := t.node(ctx, lock)
	if err != nil {
		return "", false, err
	}
	return n.read(ctx, lock)
}

// node returns the nodeTracker of the server serving lock.
func (t *tracker) node(ctx context.Context, lock string) (*nodeTracker, error) {
	addr := ""
	if t.route != nil {
		a, err := t.route(ctx, lock)
		if err != nil {
			return nil, err
		}
		addr = a
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("redis: %w", driver.ErrClosed)
	}
	n := t.nodes[addr]
	if n == nil {
		n = t.newNode(addr)
		t.nodes[addr] = n
	}
	return n, nil
}

// readBatch is the HoldWatch's batch reader: the keys grouped by the
// server serving them, one pipeline of GETs on each server's tracking
// connection, the servers in parallel.
func (t *tracker) readBatch(ctx context.Context, locks []string) []rediscore.HoldRead {
	out := make([]rediscore.HoldRead, len(locks))
	groups := map[*nodeTracker][]int{}
	for i, lock := range locks {
		n, err := t.node(ctx, lock)
		if err != nil {
			out[i].Err = err
			continue
		}
		groups[n] = append(groups[n], i)
	}
	var wg sync.WaitGroup
	for n, idx := range groups {
		wg.Go(func() {
			keys := make([]string, len(idx))
			for j, i := range idx {
				keys[j] = locks[i]
			}
			for j, r := range n.readBatch(ctx, keys) {
				out[idx[j]] = r
			}
		})
	}
	wg.Wait()
	return out
}

// refreshClient returns the tracking client that runs the Locker's
// refreshes of lock (that of the server serving it), or nil when they run
// on the Locker's own client: without NOLOOP, when the server cannot be
// named, or before its tracker has started (no hold watched there yet) and
// while its subscriber is not confirmed. A refresh there runs
// RefreshTrackedScript, which reads the key again after its PEXPIRE: the
// key stays tracked, the server sends no invalidation for the owner's own
// write, and the hold watch reads nothing after it.
//
// NOLOOP also keeps back the invalidations that a command of the tracking
// connection causes indirectly: the lazy expiry of a key it touches, which
// the refresh's reply shows (see ownRefresh), and an eviction made room for
// it, which a server with maxmemory-policy noeviction (Open's check unless
// allow_eviction=true) never makes.
func (t *tracker) refreshClient(ctx context.Context, lock string) *redis.Client {
	if t == nil || !t.noloop {
		return nil
	}
	addr := ""
	if t.route != nil {
		a, err := t.route(ctx, lock)
		if err != nil {
			return nil
		}
		addr = a
	}
	t.mu.Lock()
	n := t.nodes[addr]
	t.mu.Unlock()
	if n == nil {
		return nil
	}
	select {
	case <-n.ready:
	default:
		return nil
	}
	c, err := n.tracking()
	if err != nil {
		return nil
	}
	return c
}

// ownRefresh tells the hold watch what NOLOOP kept back after a refresh of
// lock on the tracking connection replied v, and returns the reply
// RefreshScript would have given: on 0 (the key is not the owner's; the
// refresh's read may have expired it) the watch reads the key again; 2 (the
// TTL was shortened) becomes 1.
func (t *tracker) ownRefresh(lock string, v any) any {
	switch n, _ := v.(int64); n {
	case 0:
		t.hold.Invalidate(lock)
	case 2:
		return int64(1)
	}
	return v
}

// close ends every watch and closes every server's connections.
func (t *tracker) close() {
	t.hold.Close()
	t.mu.Lock()
	t.closed = true
	nodes := t.nodes
	t.nodes = map[string]*nodeTracker{}
	t.mu.Unlock()
	for _, n := range nodes {
		n.close()
	}
}

// nodeTracker runs the two connections hold watching needs on one server:
// a RESP2 pub/sub connection subscribed to __redis__:invalidate, and a
// tracking connection (CLIENT TRACKING ON REDIRECT <the subscriber's id>)
// on which the watched keys are read. go-redis offers no hook for RESP3
// push messages on an idle connection, so the invalidations are redirected
// to a subscriber, which go-redis reads as ordinary pub/sub messages.
type nodeTracker struct {
	newClient func(onConnect func(context.Context, *redis.Conn) error, resp2 bool) *redis.Client
	hold      *rediscore.HoldWatch
	noloop    bool // CLIENT TRACKING ... NOLOOP (see tracker.refreshClient)

	subID atomic.Int64 // CLIENT ID of the subscriber's current connection

	mu      sync.Mutex
	started bool
	ready   chan struct{} // closed once the first SUBSCRIBE is confirmed
	sub     *redis.Client
	ps      *redis.PubSub
	trk     *redis.Client
	closed  bool
	done    chan struct{}
	wg      sync.WaitGroup
}

// start opens the subscriber and the receive loop, once.
func (t *nodeTracker) start() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started || t.closed {
		return
	}
	t.started = true
	t.sub = t.newClient(func(ctx context.Context, cn *redis.Conn) error {
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		t.subID.Store(id)
		return nil
	}, true)
	t.ps = t.sub.Subscribe(context.Background(), invalidateChannel)
	t.wg.Add(2)
	go t.receive(t.ps)
	go t.pinger()
}

// tracking returns the tracking client, creating it if need be.
func (t *nodeTracker) tracking() (*redis.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("redis: %w", driver.ErrClosed)
	}
	if t.trk == nil {
		t.trk = t.newTrackingClient()
	}
	return t.trk, nil
}

// newTrackingClient returns a one-connection client whose connections
// redirect their invalidations to the subscriber. A connection made after
// the first has lost the tracked keys of the one it replaces, so it makes
// every watched key be read again.
func (t *nodeTracker) newTrackingClient() *redis.Client {
	var conns atomic.Int64
	return t.newClient(func(ctx context.Context, cn *redis.Conn) error {
		id := t.subID.Load()
		if id == 0 {
			return errors.New("redis: hold watch: invalidation subscriber not connected")
		}
		args := []any{"CLIENT", "TRACKING", "ON", "REDIRECT", strconv.FormatInt(id, 10)}
		if t.noloop {
			args = append(args, "NOLOOP")
		}
		if err := cn.Do(ctx, args...).Err(); err != nil {
			return err
		}
		if conns.Add(1) > 1 {
			t.hold.Reset()
		}
		return nil
	}, false)
}

// read is GET of lock on the tracking connection, once the subscriber is
// confirmed.
func (t *nodeTracker) read(ctx context.Context, lock string) (string, bool, error) {
	t.start()
	select {
	case <-t.ready:
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
	c, err := t.tracking()
	if err != nil {
		return "", false, err
	}
	v, err := c.Get(ctx, lock).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	return v, err == nil, err
}

// readBatch is read for many keys, in one pipeline: one result per key.
func (t *nodeTracker) readBatch(ctx context.Context, locks []string) []rediscore.HoldRead {
	out := make([]rediscore.HoldRead, len(locks))
	fail := func(err error) []rediscore.HoldRead {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	t.start()
	select {
	case <-t.ready:
	case <-ctx.Done():
		return fail(ctx.Err())
	}
	c, err := t.tracking()
	if err != nil {
		return fail(err)
	}
	p := c.Pipeline()
	cmds := make([]*redis.StringCmd, len(locks))
	for i, lock := range locks {
		cmds[i] = p.Get(ctx, lock)
	}
	whole := wholeErr(p.Exec(ctx))
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case whole != nil && err == nil:
			out[i].Err = whole
		case errors.Is(err, redis.Nil):
		case err != nil:
			out[i].Err = err
		default:
			out[i] = rediscore.HoldRead{Value: v, Exists: true}
		}
	}
	return out
}

// receive reads the subscriber until close. Each invalidation marks its
// keys; a flush (no keys) marks every key. When go-redis re-subscribes on a
// new connection (a new CLIENT ID), the tracking client is replaced, so
// that it redirects to the new one, and every watched key is read again.
func (t *nodeTracker) receive(ps *redis.PubSub) {
	defer t.wg.Done()
	confirmed, failing := false, false
	backoff := 10 * time.Millisecond
	for {
		m, err := ps.Receive(context.Background())
		if err != nil {
			if !failing {
				// The server may be gone for good (a Cluster master
				// replaced by a failover): read every key again, on the
				// server that serves it now.
				failing = true
				t.hold.Reset()
			}
			select {
			case <-t.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff, failing = 10*time.Millisecond, false
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" || m.Channel != invalidateChannel {
				continue
			}
			if !confirmed {
				confirmed = true
				close(t.ready)
				continue
			}
			t.mu.Lock()
			old := t.trk
			t.trk = nil
			t.mu.Unlock()
			if old != nil {
				old.Close()
			}
			t.hold.Reset()
		case *redis.Message:
			if m.Channel != invalidateChannel {
				continue
			}
			if len(m.PayloadSlice) == 0 {
				t.hold.Reset()
				continue
			}
			t.hold.Invalidate(m.PayloadSlice...)
		}
	}
}

// pinger checks the tracking connection every trackerPing, so a broken one
// is replaced (and the keys re-read) within about that time.
func (t *nodeTracker) pinger() {
	defer t.wg.Done()
	tick := time.NewTicker(trackerPing)
	defer tick.Stop()
	for {
		select {
		case <-t.done:
			return
		case <-tick.C:
		}
		t.mu.Lock()
		c := t.trk
		t.mu.Unlock()
		if c != nil {
			ctx, cancel := context.WithTimeout(context.Background(), trackerPing)
			_ = c.Ping(ctx).Err()
			cancel()
		}
	}
}

// close closes the server's connections (the tracker has closed the
// HoldWatch).
func (t *nodeTracker) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.done)
	ps, sub, trk := t.ps, t.sub, t.trk
	t.mu.Unlock()
	if ps != nil {
		ps.Close()
	}
	t.wg.Wait()
	if sub != nil {
		sub.Close()
	}
	if trk != nil {
		trk.Close()
	}
}
