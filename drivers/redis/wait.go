package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/rediscore"
)

// subscriber is the driver.Waiter machinery for one go-redis client: one
// PubSub connection, opened on the first wait and shared by every key and
// every local waiter (a rediscore.Hub fans messages out), with channels
// added and removed as waits start and end. The release script publishes
// on the key's channel.
//
// A SUBSCRIBE counts as effective only once its confirmation has been read
// back, so a release that happens after Subscribe returned is never missed.
// When the connection drops, every waiter is woken at once, and each
// channel's waiters once more when go-redis has resubscribed it.
type subscriber struct {
	client redis.UniversalClient
	hub    *rediscore.Hub

	mu      sync.Mutex
	ps      *redis.PubSub
	closed  bool
	pending map[string]int             // SUBSCRIBEs sent, confirmations not yet read
	waiters map[string][]chan struct{} // closed when pending drops to zero
	// listeners are the channels subscribed by Listen, with their callbacks.
	listeners map[string]func(string)
	done      chan struct{} // closed by close; ends the receive loop
	loopEnd   chan struct{} // closed when the receive loop returns
}

func newSubscriber(c redis.UniversalClient) *subscriber {
	s := &subscriber{client: c, pending: map[string]int{}, waiters: map[string][]chan struct{}{}, done: make(chan struct{})}
	s.hub = rediscore.NewHub(s.subscribe, s.unsubscribe)
	return s
}

// subscribe is the Hub's subscribe: SUBSCRIBE channel, then wait for the
// confirmation or ctx.
func (s *subscriber) subscribe(ctx context.Context, channel string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return rediscore.ErrHubClosed
	}
	if s.ps == nil {
		s.ps = s.client.Subscribe(context.WithoutCancel(ctx))
		s.loopEnd = make(chan struct{})
		go s.loop(s.ps)
	}
	ps := s.ps
	ready := make(chan struct{})
	s.pending[channel]++
	s.waiters[channel] = append(s.waiters[channel], ready)
	s.mu.Unlock()

	// go-redis may block past ctx while it sets up the pub/sub connection
	// (against a frozen server, for its read timeouts): wait for the
	// SUBSCRIBE in the background and return when ctx ends. A SUBSCRIBE
	// that lands later is confirmed as a resubscription: a spurious wake.
	errc := make(chan error, 1)
	go func() { errc <- ps.Subscribe(ctx, channel) }()
	var err error
	select {
	case err = <-errc:
		if err == nil {
			select {
			case <-ready:
				return nil
			case <-ctx.Done():
				err = ctx.Err()
			case <-s.done:
				err = rediscore.ErrHubClosed
			}
		}
	case <-ctx.Done():
		err = ctx.Err()
	case <-s.done:
		err = rediscore.ErrHubClosed
	}
	s.abandon(channel, ready)
	rediscore.SettleDeadline(ctx, err)
	if ctx.Err() != nil {
		return fmt.Errorf("redis: subscribe: %w", ctx.Err())
	}
	return fmt.Errorf("redis: subscribe: %w", err)
}

// abandon forgets a SUBSCRIBE whose caller gave up; its confirmation, if it
// comes, is then treated as a resubscription (a spurious wake-up).
func (s *subscriber) abandon(channel string, ready chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[channel]
	for i, w := range ws {
		if w == ready {
			s.waiters[channel] = append(ws[:i:i], ws[i+1:]...)
			if s.pending[channel] > 0 {
				s.pending[channel]--
			}
			break
		}
	}
	if len(s.waiters[channel]) == 0 {
		delete(s.waiters, channel)
		delete(s.pending, channel)
	}
}

// unsubscribe is the Hub's unsubscribe (called with the Hub's lock held).
func (s *subscriber) unsubscribe(channel string) {
	s.mu.Lock()
	ps := s.ps
	s.mu.Unlock()
	if ps != nil {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultWriteTimeout)
		defer cancel()
		_ = ps.Unsubscribe(ctx, channel)
	}
}

// confirmed handles a "subscribe" confirmation.
func (s *subscriber) confirmed(channel string) {
	s.mu.Lock()
	if s.pending[channel] > 0 {
		s.pending[channel]--
		if s.pending[channel] == 0 {
			for _, w := range s.waiters[channel] {
				close(w)
			}
			delete(s.waiters, channel)
			delete(s.pending, channel)
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	// A resubscription after a reconnect: a release may have been missed.
	s.hub.Wake(channel)
}

// lost handles a dropped connection: go-redis reconnects and resubscribes
// every channel, so each channel still waiting for a confirmation expects
// exactly one more.
func (s *subscriber) lost() {
	s.mu.Lock()
	for ch := range s.pending {
		if len(s.waiters[ch]) > 0 {
			s.pending[ch] = 1
		} else {
			delete(s.pending, ch)
		}
	}
	s.mu.Unlock()
	s.hub.WakeAll()
}

func (s *subscriber) loop(ps *redis.PubSub) {
	defer close(s.loopEnd)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	backoff := time.Millisecond
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if errors.Is(err, redis.ErrClosed) {
				return
			}
			s.lost()
			// Receive reconnects on its next call; do not spin while the
			// server is down.
			select {
			case <-s.done:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				s.confirmed(m.Channel)
			}
		case *redis.Message:
			if f := s.listener(m.Channel); f != nil {
				f(m.Payload)
			} else {
				s.hub.Wake(m.Channel)
			}
		}
	}
}

// Subscribe registers wake for channel (see rediscore.Hub.Subscribe).
func (s *subscriber) Subscribe(ctx context.Context, channel string, wake chan<- struct{}) (func(), error) {
	return s.hub.Subscribe(ctx, channel, wake)
}

// close ends the subscription machinery; waiters are woken once.
func (s *subscriber) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.done)
	ps, end := s.ps, s.loopEnd
	s.mu.Unlock()
	s.hub.Close()
	if ps != nil {
		_ = ps.Close()
		<-end
	}
}

// waiter is the Locker's rediscore.Waiter: one subscriber per deployment
// (N for Redlock) and, where holds are watched, the tracker, which Shut
// closes too.
type waiter struct {
	subs   []*subscriber
	quorum int // subscriptions Subscribe needs (1, or N/2+1)
	// nodeTimeout bounds each node's subscription under Redlock
	// (Options.NodeTimeout): a node that does not confirm by then counts
	// as failed.
	nodeTimeout time.Duration
	tracker     *tracker // nil where hold watching is unsupported
}

// Subscribe subscribes to channel on every server; under Redlock it
// returns once a quorum confirmed (see Locker).
func (w *waiter) Subscribe(ctx context.Context, _, channel string) (<-chan struct{}, func(), error) {
	if len(w.subs) == 1 {
		return w.subs[0].hub.Wait(ctx, channel)
	}
	return w.subscribeQuorum(ctx, channel, make(chan struct{}, 1))
}

// Shut closes the tracker and every subscriber.
func (w *waiter) Shut() {
	if w.tracker != nil {
		w.tracker.close()
	}
	for _, s := range w.subs {
		s.close()
	}
}
func (w *waiter) subscribeQuorum(ctx context.Context, channel string, wake chan struct{}) (<-chan struct{}, func(), error) {
	sctx, stop := context.WithTimeout(context.WithoutCancel(ctx), w.nodeTimeout)
	type result struct {
		cancel func()
		err    error
	}
	results := make(chan result, len(w.subs))
	for _, s := range w.subs {
		go func() {
			c, err := s.Subscribe(sctx, channel, wake)
			results <- result{c, err}
		}()
	}
	var (
		mu       sync.Mutex
		cancels  []func()
		finished bool
	)
	// collect keeps the cancel funcs of subscriptions that succeed after
	// Subscribe returned.
	collect := func(r result) {
		if r.err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if finished {
			r.cancel()
			return
		}
		cancels = append(cancels, r.cancel)
	}
	cancelAll := func() {
		stop()
		mu.Lock()
		defer mu.Unlock()
		finished = true
		for _, c := range cancels {
			c()
		}
		cancels = nil
	}
	ok, failed := 0, 0
	var first error
	for ok < w.quorum && failed < len(w.subs)-w.quorum+1 {
		select {
		case r := <-results:
			collect(r)
			if r.err == nil {
				ok++
			} else {
				failed++
				if first == nil {
					first = r.err
				}
			}
		case <-ctx.Done():
			go drain(results, len(w.subs)-ok-failed, collect)
			cancelAll()
			return nil, nil, fmt.Errorf("redis: subscribe: %w", ctx.Err())
		}
	}
	go drain(results, len(w.subs)-ok-failed, collect)
	if ok < w.quorum {
		cancelAll()
		return nil, nil, fmt.Errorf("redis: redlock subscribe: %d of %d nodes confirmed (quorum %d): %w", ok, len(w.subs), w.quorum, first)
	}
	var once sync.Once
	return wake, func() { once.Do(cancelAll) }, nil
}

func drain[T any](ch <-chan T, n int, f func(T)) {
	for range n {
		f(<-ch)
	}
}
