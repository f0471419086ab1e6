package rediscore

import (
	"context"
	"sync"
)

// Hub fans one server-side subscription per channel out to any number of
// local subscribers (an addition to the core API, used by both drivers'
// driver.Waiter). The first local subscriber of a channel makes the server
// subscription; later ones share it; the last one to cancel removes it. A
// release therefore costs the server one PUBLISH and one message per process,
// however many goroutines of that process wait.
//
// The adapter supplies two functions: subscribe, which must return only once
// the subscription is effective on the server (the SUBSCRIBE confirmation
// was read, or the client-side-caching tracking is on), or with an error
// wrapping ctx.Err() once ctx is done; and unsubscribe, which must not block
// for long (it is called with the Hub's lock held, which keeps a later
// subscribe of the same channel ordered after it). The adapter calls Wake
// when a message (or an invalidation) arrives for a channel, and WakeAll
// after a lost connection has been re-established.
type Hub struct {
	p           prefix // starts its errors; "redis" unless Named
	subscribe   func(ctx context.Context, channel string) error
	unsubscribe func(channel string)

	mu     sync.Mutex
	chans  map[string]*hubEntry
	closed bool
}

type hubEntry struct {
	subs  map[*hubSub]struct{}
	ready chan struct{} // closed once the server subscription is effective or failed
	err   error         // set before ready is closed if it failed
}

type hubSub struct{ wake chan<- struct{} }

// NewHub returns a Hub over the adapter's subscribe and unsubscribe.
func NewHub(subscribe func(ctx context.Context, channel string) error, unsubscribe func(channel string)) *Hub {
	return &Hub{p: "redis", subscribe: subscribe, unsubscribe: unsubscribe, chans: map[string]*hubEntry{}}
}

// Named sets the driver name the Hub's errors start with ("redis" by
// default) and returns h. Call it before the first Subscribe.
func (h *Hub) Named(name string) *Hub {
	h.p = prefix(name)
	return h
}

// Subscribe registers wake (which should be buffered: sends never block and
// are dropped when it is full) for channel, and returns once the server
// subscription is effective. cancel unregisters it and may be called more
// than once. Errors: ctx.Err() wrapped once ctx is done, the adapter's
// subscribe error, or ErrHubClosed.
func (h *Hub) Subscribe(ctx context.Context, channel string, wake chan<- struct{}) (cancel func(), err error) {
	// A done ctx fails even when the channel is already subscribed (a
	// select below would otherwise pick the ready channel half the time).
	if err := ctx.Err(); err != nil {
		return nil, h.p.ctxErr(ctx, "subscribe", err)
	}
	s := &hubSub{wake: wake}
	for {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil, ErrHubClosed
		}
		e, ok := h.chans[channel]
		first := !ok
		if first {
			e = &hubEntry{subs: map[*hubSub]struct{}{}, ready: make(chan struct{})}
			h.chans[channel] = e
		}
		e.subs[s] = struct{}{}
		h.mu.Unlock()

		if first {
			err := h.subscribe(ctx, channel)
			h.mu.Lock()
			if err != nil {
				e.err = err
				delete(h.chans, channel)
				if !h.closed {
					h.unsubscribe(channel)
				}
			}
			close(e.ready)
			h.mu.Unlock()
			if err != nil {
				return nil, err
			}
		} else {
			select {
			case <-e.ready:
			case <-ctx.Done():
				h.remove(channel, e, s)
				return nil, h.p.ctxErr(ctx, "subscribe", ctx.Err())
			}
			if e.err != nil {
				// The first subscriber failed (maybe only its ctx ended): try again.
				if err := ctx.Err(); err != nil {
					return nil, h.p.ctxErr(ctx, "subscribe", err)
				}
				continue
			}
		}
		var once sync.Once
		return func() { once.Do(func() { h.remove(channel, e, s) }) }, nil
	}
}

// Wait is Subscribe with a wake channel of its own (buffered 1), in the
// shape of Waiter.Subscribe.
func (h *Hub) Wait(ctx context.Context, channel string) (<-chan struct{}, func(), error) {
	wake := make(chan struct{}, 1)
	cancel, err := h.Subscribe(ctx, channel, wake)
	if err != nil {
		return nil, nil, err
	}
	return wake, cancel, nil
}

func (h *Hub) remove(channel string, e *hubEntry, s *hubSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(e.subs, s)
	if len(e.subs) == 0 && h.chans[channel] == e {
		select {
		case <-e.ready:
			delete(h.chans, channel)
			if !h.closed {
				h.unsubscribe(channel)
			}
		default:
			// The first subscriber is still subscribing; it keeps the
			// entry, and the next subscriber reuses it.
		}
	}
}

// Wake sends a wake-up to every local subscriber of channel.
func (h *Hub) Wake(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.chans[channel]; e != nil {
		for s := range e.subs {
			notify(s.wake)
		}
	}
}

// WakeAll sends a wake-up to every local subscriber of every channel.
func (h *Hub) WakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.chans {
		for s := range e.subs {
			notify(s.wake)
		}
	}
}

// Channels returns the channels with at least one local subscriber (for
// resubscribing after a reconnect, and for tests).
func (h *Hub) Channels() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.chans))
	for c := range h.chans {
		out = append(out, c)
	}
	return out
}

// Close wakes every subscriber once and makes later Subscribe calls fail
// with ErrHubClosed. It does not call unsubscribe: the adapter closes its
// connection.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	h.closed = true
	for _, e := range h.chans {
		for s := range e.subs {
			notify(s.wake)
		}
	}
}

func notify(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}
