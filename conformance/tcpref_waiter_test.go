package conformance_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// Subscribe implements driver.Waiter: the server pushes a WAKE on each
// release of key. Expiries are not pushed: Acquire reports the holder's
// remaining TTL in a *driver.HeldError, and package locker wakes itself
// then.
func (l *tcpLocker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := l.check(key, noTTL); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("tcpref: subscribe: %w", err)
	}
	sid := l.ids.Add(1)
	sub := &tcpSub{key: key, wake: make(chan struct{}, 1)}
	l.mu.Lock()
	l.subs[sid] = sub
	l.mu.Unlock()
	st, _, err := l.call(ctx, "SUB", u64(sid), []byte(key))
	if err == nil && st != "OK" {
		err = fmt.Errorf("tcpref: subscribe: server replied %s", st)
	}
	if err != nil {
		l.unsubscribe(sid)
		return nil, nil, err
	}
	return sub.wake, sync.OnceFunc(func() { l.unsubscribe(sid) }), nil
}

// unsubscribe forgets a subscription here and, without waiting, on the
// server.
func (l *tcpLocker) unsubscribe(sid uint64) {
	l.mu.Lock()
	delete(l.subs, sid)
	s := l.sess
	l.mu.Unlock()
	if s != nil {
		_, _ = s.send(l.ids.Add(1), "UNSUB", u64(sid)) // the reply is dropped
	}
}

// wake wakes one subscriber; its channel is buffered, so a wake-up it has
// not taken yet stands for this one too.
func (l *tcpLocker) wake(sid uint64) {
	l.mu.Lock()
	sub := l.subs[sid]
	l.mu.Unlock()
	if sub != nil {
		select {
		case sub.wake <- struct{}{}:
		default:
		}
	}
}

// restoreLocked runs on a new session, before any call is sent on it. On
// a re-dial it re-checks every watched grant (see recheckLocked); then it
// re-subscribes every subscription (the server's ended with the old
// connection), and once the server has confirmed them all, wakes every
// subscriber once, since a release may have passed unseen between the two
// connections. l.mu is held.
func (l *tcpLocker) restoreLocked(s *tcpSession) {
	again := l.dialed > 1
	if again && l.is("tcp-reset-reasserts") {
		for key, b := range l.believed { // re-takes what it once held, released or not
			_, _ = s.send(l.ids.Add(1), "PUT", []byte(key), []byte(b.owner), dur(b.ttl))
		}
	}
	if again {
		l.recheckLocked(s)
	}
	if len(l.subs) == 0 {
		return
	}
	if l.is("tcp-waiter-deaf-after-reset") && again { // wakes everyone, but never re-subscribes
		go l.wakeAll(nil, nil)
		return
	}
	if l.is("tcp-waiter-deaf-wakes-late") && again { // the same, with its one wake-up 300ms late
		time.AfterFunc(300*time.Millisecond, func() { l.wakeAll(nil, nil) })
		return
	}
	var acks []<-chan [][]byte
	for sid, sub := range l.subs {
		ch, err := s.send(l.ids.Add(1), "SUB", u64(sid), []byte(sub.key))
		if err != nil {
			return // the session broke: the next one re-subscribes
		}
		acks = append(acks, ch)
	}
	if again {
		go l.wakeAll(s, acks)
	}
}

// wakeAll wakes every subscriber once the acks have come on s (none to
// wait for if s is nil).
func (l *tcpLocker) wakeAll(s *tcpSession, acks []<-chan [][]byte) {
	for _, ch := range acks {
		select {
		case <-ch:
		case <-s.dead:
			return
		case <-l.quit:
			return
		}
	}
	l.mu.Lock()
	sids := make([]uint64, 0, len(l.subs))
	for sid := range l.subs {
		sids = append(sids, sid)
	}
	l.mu.Unlock()
	for _, sid := range sids {
		l.wake(sid)
	}
}

// lost is called once a session broke: while subscriptions are open or
// grants watched, a loop re-dials without waiting for a call.
func (l *tcpLocker) lost(s *tcpSession) {
	l.mu.Lock()
	if l.sess == s {
		l.sess = nil
	}
	start := len(l.subs)+len(l.watches) > 0 && !l.closed && !l.redialing
	if start {
		l.redialing = true
	}
	l.mu.Unlock()
	if start {
		go l.redial()
	}
}

// redial dials until a session is up (and was not lost at once), backing
// off from 5ms to 200ms, or until nothing is subscribed or watched, or l
// is closed.
func (l *tcpLocker) redial() {
	for backoff := 5 * time.Millisecond; ; backoff = min(2*backoff, 200*time.Millisecond) {
		select {
		case <-l.quit:
			return
		case <-time.After(backoff):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s, err := l.session(ctx)
		cancel()
		l.mu.Lock()
		if (err == nil && l.sess == s) || len(l.subs)+len(l.watches) == 0 || l.closed {
			l.redialing = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
	}
}

var _ driver.Waiter = (*tcpLocker)(nil)
