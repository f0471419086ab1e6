package redis

import (
	"context"
)

// Listen implements rediscore.Listener on the subscriber's pub/sub
// connection: channel stays subscribed until close, msg gets every
// message's payload, and "" after each resubscription that followed a
// lost connection.
func (s *subscriber) Listen(ctx context.Context, channel string, msg func(payload string)) error {
	s.mu.Lock()
	if s.listeners == nil {
		s.listeners = map[string]func(string){}
	}
	s.listeners[channel] = msg
	s.mu.Unlock()
	resub := make(chan struct{}, 1)
	if _, err := s.hub.Subscribe(ctx, channel, resub); err != nil {
		s.mu.Lock()
		delete(s.listeners, channel)
		s.mu.Unlock()
		return err
	}
	go func() {
		for {
			select {
			case <-resub:
				msg("")
			case <-s.done:
				return
			}
		}
	}()
	return nil
}

// listener returns the Listen callback of channel, or nil.
func (s *subscriber) listener(channel string) func(string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listeners[channel]
}
