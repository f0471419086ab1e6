package rueidis

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/rueidis"
)

// listener implements rediscore.Listener (the fair queue's wake channel)
// with one Receive loop per channel on client.
type listener struct {
	client rueidis.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	stops  []context.CancelFunc // of the subscriptions that are up
}

func newListener(client rueidis.Client) *listener {
	ctx, cancel := context.WithCancel(context.Background())
	return &listener{client: client, ctx: ctx, cancel: cancel}
}

// Listen implements rediscore.Listener: channel stays subscribed until
// Shut; msg gets every payload, and "" after a resubscription.
func (l *listener) Listen(ctx context.Context, channel string, msg func(payload string)) error {
	rctx, stop := context.WithCancel(l.ctx)
	settled := make(chan error, 1)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		receive(rctx, l.client, channel, settled, msg, func() { msg("") })
	}()
	select {
	case err := <-settled:
		if err != nil {
			stop()
			return err
		}
		l.mu.Lock()
		l.stops = append(l.stops, stop)
		l.mu.Unlock()
		return nil
	case <-ctx.Done():
		stop()
		return fmt.Errorf("rueidis: subscribe %s: %w", channel, ctx.Err())
	}
}

// Shut ends every subscription; the client is closed by its owner.
func (l *listener) Shut() {
	l.mu.Lock()
	for _, stop := range l.stops {
		stop()
	}
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}
