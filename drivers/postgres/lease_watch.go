package postgres

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgconn"
)

// errListenPooler is returned by leaseLocker.subscribe when the Locker's
// connections go through a pooler: a transaction-mode pooler hands the
// LISTENing server session to other clients between transactions, so
// notifications would be lost. AcquireWait then waits without
// notifications: it retries at the holder's remaining TTL (reported by
// Acquire) and on its capped backoff.
var errListenPooler = errors.New("postgres: LISTEN does not work through a pooler; waits fall back to the holder's TTL and backoff")

// Backoff of the listener's reconnection.
const (
	listenRetryMin = 10 * time.Millisecond
	listenRetryMax = time.Second
)

// subscribe is the wake-up of a lease-mode wait: LISTEN/NOTIFY: a Release
// notifies on the channel "locker_lease" with the key's id, and one
// listener connection per leaseLocker, opened by the first subscribe
// outside the pool, LISTENs for all the keys its callers wait for. wake
// receives a value after each release of key. Expiry is not notified:
// Acquire reports the holder's remaining TTL (driver.HeldError), and
// acquireWait retries at that moment. After the listener connection is
// lost it reconnects (backoff 10ms to 1s) and then wakes every subscriber
// once, since a release in between may have been missed.
//
// Errors: errListenPooler behind a pooler (see there); driver.ErrInvalid
// for an empty key; driver.ErrClosed; ctx.Err() if ctx ends before the
// listener's first connection attempt has finished.
func (l *leaseLocker) subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if key == "" {
		return nil, nil, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("postgres: subscribe: %w", err)
	}
	if l.pooler {
		return nil, nil, errListenPooler
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, driver.ErrClosed
	}
	lis := l.lis
	if lis == nil {
		lis = l.newListener()
		l.lis = lis
	}
	l.mu.Unlock()
	payload := hex.EncodeToString(leaseID(l.ns, key))
	ch := make(chan struct{}, 1)
	cancel := lis.add(payload, ch)
	select {
	case <-lis.tried:
		return ch, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("postgres: subscribe: %w", ctx.Err())
	case <-lis.done:
		cancel()
		return nil, nil, driver.ErrClosed
	}
}

// listener is the LISTEN connection of a leaseLocker and its subscribers.
type listener struct {
	cfg    *pgconn.Config
	cancel context.CancelFunc
	tried  chan struct{} // closed after the first connection attempt
	done   chan struct{} // closed when run returns

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // by payload
}

func (l *leaseLocker) newListener() *listener {
	ctx, cancel := context.WithCancel(l.ctx)
	s := &listener{cancel: cancel, tried: make(chan struct{}), done: make(chan struct{}),
		subs: map[string]map[chan struct{}]struct{}{}}
	s.cfg = l.pool.Config().ConnConfig.Config.Copy()
	s.cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if n.Channel == leaseChannel {
			s.wake(n.Payload)
		}
	}
	go s.run(ctx)
	return s
}

// add registers ch for payload; the returned func removes it.
func (s *listener) add(payload string, ch chan struct{}) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.subs[payload]
	if m == nil {
		m = map[chan struct{}]struct{}{}
		s.subs[payload] = m
	}
	m[ch] = struct{}{}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.subs[payload], ch)
			if len(s.subs[payload]) == 0 {
				delete(s.subs, payload)
			}
		})
	}
}

// wake signals the subscribers of payload.
func (s *listener) wake(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs[payload] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// wakeAll signals every subscriber.
func (s *listener) wakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.subs {
		for ch := range m {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// run keeps a LISTEN connection open until ctx is done.
func (s *listener) run(ctx context.Context) {
	defer close(s.done)
	first := true
	delay := listenRetryMin
	for {
		conn, err := pgconn.ConnectConfig(ctx, s.cfg)
		if err == nil {
			_, err = conn.Exec(ctx, `LISTEN `+leaseChannel).ReadAll()
		}
		if first {
			first = false
			close(s.tried)
		} else if err == nil {
			// Releases while we were not listening were missed.
			s.wakeAll()
		}
		if err == nil {
			delay = listenRetryMin
			for err == nil {
				err = conn.WaitForNotification(ctx)
			}
		}
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = conn.Close(cctx)
			cancel()
		}
		if ctx.Err() != nil {
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, listenRetryMax)
	}
}

// close stops the listener and waits for its goroutine.
func (s *listener) close() {
	s.cancel()
	<-s.done
}
