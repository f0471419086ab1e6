package conformance_test

import (
	"fmt"
	"sync"

	"github.com/go-locker/locker/driver"
)

// tcpWatch is one grant watched through WatchHold.
type tcpWatch struct {
	key, owner string
	token      uint64
	lost       func(error)
	once       sync.Once
}

// WatchHold implements driver.HoldWatcher. The server ends a lease early
// only when it restarts without its data, which breaks every connection:
// so each new session re-checks every watched grant with Inspect, and
// reports it lost if the server no longer has it under that owner and
// token. While a grant is watched, a broken session is re-dialled at once
// (see redial), so the check does not wait for the next call.
func (l *tcpLocker) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	if err := l.check(key, noTTL); err != nil {
		return nil, err
	}
	id := l.ids.Add(1)
	l.mu.Lock()
	l.watches[id] = &tcpWatch{key: key, owner: owner, token: token, lost: lost}
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		delete(l.watches, id)
		l.mu.Unlock()
	}, nil
}

// recheckLocked sends, on a new session, an Inspect of every watched grant,
// and reports the ones the server no longer has. l.mu is held.
func (l *tcpLocker) recheckLocked(s *tcpSession) {
	for id, w := range l.watches {
		ch, err := s.send(l.ids.Add(1), "INS", []byte(w.key))
		if err != nil {
			return // the session broke: the next one re-checks
		}
		go l.recheck(s, id, w, ch)
	}
}

func (l *tcpLocker) recheck(s *tcpSession, id uint64, w *tcpWatch, ch <-chan [][]byte) {
	var f [][]byte
	select {
	case f = <-ch:
	case <-s.dead:
		return
	case <-l.quit:
		return
	}
	if string(f[0]) == "OK" && len(f) == 4 {
		if tok, _ := num(f[2]); string(f[1]) == w.owner && tok == w.token {
			return // still held
		}
	}
	l.mu.Lock()
	delete(l.watches, id)
	l.mu.Unlock()
	w.once.Do(func() {
		w.lost(fmt.Errorf("tcpref: the server no longer holds the lock after a reconnect: %w", driver.ErrNotHeld))
	})
}

var _ driver.HoldWatcher = (*tcpLocker)(nil)
