package mem

import (
	"context"
	"sync"
)

// changeWatch is one WatchChanges watch: a change marks it, and its own
// goroutine calls changed, so that changed runs outside the store's lock,
// one call at a time, and stop need not wait for it.
type changeWatch struct {
	dirty chan struct{} // buffered: marks made while changed runs make one more call
	done  chan struct{} // closed by stop
}

func (w *changeWatch) mark() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

func (w *changeWatch) loop(changed func()) {
	for {
		select {
		case <-w.done:
			return
		case <-w.dirty:
		}
		select {
		case <-w.done:
			return
		default:
			changed()
		}
	}
}

// WatchChanges implements driver.ChangeWatcher: changed is called, from a
// goroutine of the watch and never with the store's lock held, after every
// grant of key to a new owner, release and expiry (several changes while a
// call runs make one more call). stop returns at once, without waiting for
// a call in flight. Errors as for Acquire.
func (c *Locker) WatchChanges(ctx context.Context, key string, changed func()) (func(), error) {
	if err := c.check(ctx, key); err != nil {
		return nil, err
	}
	s := c.s
	w := &changeWatch{dirty: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop(changed)
	s.mu.Lock()
	if s.changes[key] == nil {
		s.changes[key] = map[*changeWatch]struct{}{}
	}
	s.changes[key][w] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(w.done)
			s.mu.Lock()
			delete(s.changes[key], w)
			if len(s.changes[key]) == 0 {
				delete(s.changes, key)
			}
			s.mu.Unlock()
		})
	}, nil
}
