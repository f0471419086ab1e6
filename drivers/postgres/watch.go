package postgres

import (
	"fmt"

	"github.com/go-locker/locker/driver"
)

// WatchHold implements driver.HoldWatcher: it watches the session pinned to
// the grant of key to owner with token, and calls lost once that session
// ends while the lock is held: the backend was terminated, the server
// crashed, restarted or failed over, or the connection was reset or closed
// by the server or anything in between. Such a session can never refresh
// or release the lock again, and when its end comes from the server the
// lock is already free on the server.
//
// Two watches run. The pinned socket is registered with an epoll instance
// (one goroutine per Locker) for the peer-closed, hang-up and error
// conditions only, so the replies to Refresh and Release wake nothing: a
// session the server ends on a connection that reaches the client is heard
// at once, at no cost in traffic. A session probe hears the rest, such as a
// half-open connection whose server side was reset while the client side
// stays open and silent: while any lock of the Locker is watched, one
// statement every 200ms, on a connection of its own made with the pool's
// connection settings (outside the pool, closed after 30s without a
// watched lock), looks up in pg_locks whether each
// watched lock's session still holds it, so the end of a session is heard
// within about a second whatever the holder's socket shows. A look-up that
// fails, or that reaches another server address than the lock's
// connection, reports nothing. Release and Close end the watch first, so
// they are never reported as a loss.
//
// Errors: driver.ErrNotHeld if this Locker does not hold key for owner with
// token (any more); driver.ErrClosed; an error matching
// errors.ErrUnsupported where the socket cannot be watched (outside Linux,
// or a connection that is not a socket).
func (l *advisoryLocker) WatchHold(key, owner string, token uint64, lost func(error)) (func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, driver.ErrClosed
	}
	var h *hold
	if s := l.slots[mutexID(key)]; s != nil {
		h = s.cur
	}
	if h == nil || h.owner != owner || h.token != token || h.gone {
		return nil, notHeld("watch", key)
	}
	if h.mon == nil {
		if l.watcher == nil {
			w, err := newSessionWatcher()
			if err != nil {
				return nil, err
			}
			l.watcher = w
		}
		if l.goneFn == nil {
			l.goneFn = l.sessionGone
		}
		mon, err := l.watcher.add(h.conn.Conn().PgConn().Conn(), l.goneFn, h)
		if err != nil {
			return nil, err
		}
		h.mon = mon
		h.listeners = h.one[:0]
		if l.prober == nil {
			l.prober = newSessionProber(l)
		}
		l.prober.wake()
	}
	l.listeners++
	id := l.listeners
	h.listeners = append(h.listeners, holdListener{id: id, lost: lost})
	return func() { l.unwatch(h, id) }, nil
}

// unwatch removes one listener; the socket watch ends with the last.
func (l *advisoryLocker) unwatch(h *hold, id uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, x := range h.listeners {
		if x.id == id {
			last := len(h.listeners) - 1
			h.listeners[i] = h.listeners[last]
			h.listeners[last] = holdListener{}
			h.listeners = h.listeners[:last]
			if last == 0 {
				h.unwatchLocked()
			}
			return
		}
	}
}

// unwatchLocked ends h's watch without a report; Locker.mu is held.
func (h *hold) unwatchLocked() {
	if h.mon != nil {
		h.mon.remove()
		h.mon = nil
	}
	h.listeners = nil
}

// reportGone marks h's session ended and tells its listeners, once. It
// reports whether it did (false if h was no longer watched or already
// reported).
func (l *advisoryLocker) reportGone(h *hold, cause error) bool {
	l.mu.Lock()
	if h.gone || h.listeners == nil {
		h.gone = true
		l.mu.Unlock()
		return false
	}
	h.gone = true
	ls := h.listeners
	h.unwatchLocked()
	l.mu.Unlock()
	err := fmt.Errorf("postgres: %q: %w: %w", h.key, driver.ErrNotHeld, cause)
	for _, x := range ls {
		x.lost(err)
	}
	return true
}

// sessionGone is the watcher's report that h's socket closed: it tells the
// listeners and then drops the hold and its connection.
func (l *advisoryLocker) sessionGone(h *hold, cause error) {
	if !l.reportGone(h, cause) {
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.ops.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.ops.Done()
		s := l.peekSlot(mutexID(h.key))
		if s == nil {
			return
		}
		defer l.putSlot(mutexID(h.key), s)
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.h == h {
			l.setHold(s, nil)
			destroy(h.conn)
		}
	}()
}
