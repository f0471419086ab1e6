package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
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
	return l.subscribeID(ctx, leaseID(l.ns, key))
}

// subscribeID is subscribe for the lease table row id (of either table).
func (l *leaseLocker) subscribeID(ctx context.Context, id []byte) (<-chan struct{}, func(), error) {
	return l.listen(ctx, &l.lis, id, leaseChannel)
}

// subscribeShared is subscribe for a shared lock's waiter: its channel
// receives a value when a change of the lock (the shared table's row id)
// names owner in a targeted wake-up (see sharedWakePayload), and also on a
// notification of the whole lock, which clients of earlier versions send
// on release.
func (l *leaseLocker) subscribeShared(ctx context.Context, id []byte, owner string) (<-chan struct{}, func(), error) {
	return l.listenPayloads(ctx, &l.lis, []string{hex.EncodeToString(id), sharedWakePayload(id, owner)}, leaseChannel)
}

// sharedWakePayload is the NOTIFY payload that wakes owner's wait for the
// shared lock id: the hex of id, a colon, and the hex of the first 8 bytes
// of owner's SHA-256 (the shared table's wake function makes the same),
// so that payloads keep a fixed length and owner's bytes stay opaque.
func sharedWakePayload(id []byte, owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(id) + ":" + hex.EncodeToString(sum[:8])
}

// listen registers a wake-up channel for id with the listener *lis, started
// (LISTENing on channels) if it is not yet.
func (l *leaseLocker) listen(ctx context.Context, lis **listener, id []byte, channels ...string) (<-chan struct{}, func(), error) {
	return l.listenPayloads(ctx, lis, []string{hex.EncodeToString(id)}, channels...)
}

// listenPayloads registers one wake-up channel for each of payloads with
// the listener *lis, started (LISTENing on channels) if it is not yet.
func (l *leaseLocker) listenPayloads(ctx context.Context, lis **listener, payloads []string, channels ...string) (<-chan struct{}, func(), error) {
	if l.pooler {
		return nil, nil, errListenPooler
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, nil, driver.ErrClosed
	}
	s := *lis
	if s == nil {
		s = l.newListener(channels)
		*lis = s
	}
	l.mu.Unlock()
	ch := make(chan struct{}, 1)
	cancels := make([]func(), len(payloads))
	for i, p := range payloads {
		cancels[i] = s.add(p, ch)
	}
	cancel := func() {
		for _, c := range cancels {
			c()
		}
	}
	select {
	case <-s.tried:
		return ch, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, fmt.Errorf("postgres: subscribe: %w", ctx.Err())
	case <-s.done:
		cancel()
		return nil, nil, driver.ErrClosed
	}
}

// listener is a LISTEN connection of a leaseLocker and its subscribers.
type listener struct {
	cfg      *pgconn.Config
	channels []string // LISTENed to; a notification on any wakes its payload's subscribers
	cancel   context.CancelFunc
	tried    chan struct{} // closed after the first connection attempt
	done     chan struct{} // closed when run returns

	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{} // by payload
}

func (l *leaseLocker) newListener(channels []string) *listener {
	ctx, cancel := context.WithCancel(l.ctx)
	s := &listener{channels: channels, cancel: cancel, tried: make(chan struct{}), done: make(chan struct{}),
		subs: map[string]map[chan struct{}]struct{}{}}
	s.cfg = l.pool.Config().ConnConfig.Config.Copy()
	s.cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) {
		if slices.Contains(s.channels, n.Channel) {
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
		for _, c := range s.channels {
			if err == nil {
				_, err = conn.Exec(ctx, `LISTEN `+c).ReadAll()
			}
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
