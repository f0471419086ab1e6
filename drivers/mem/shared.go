package mem

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/go-locker/locker/driver"
)

// Shared holds (driver.SharedLocker): semaphores and read-write locks.
//
// Each lock is a set of holders, one per owner, each with its own expiry on
// the monotonic clock and its own timer, plus a FIFO queue of waiting
// requests. A request is granted at once only if nobody queues ahead of it
// and it fits beside the holders (a permit: fewer holders than its limit; a
// read: no writer; a write: no holder at all). Otherwise it waits in the
// queue, or fails with driver.ErrNotAcquired if it may not wait. Whenever a
// hold ends (release, expiry) or a waiter leaves, the queue is granted from
// its head for as long as its head fits: a run of readers, or one writer,
// or permits while slots last. Only the waiters so granted are woken. A
// waiting writer thus blocks every read that arrives after it. Tokens come
// from the store's one counter, shared with the mutexes.
//
// A semaphore and a read-write lock on the same key live apart from each
// other and from the mutex on that key.

// sharedID names one semaphore (rw false) or read-write lock (rw true).
type sharedID struct {
	rw  bool
	key string
}

type sharedLock struct {
	holders map[string]*sharedHold // by owner
	queue   []*sharedWaiter
}

type sharedHold struct {
	mode    driver.SharedMode
	token   uint64
	expires time.Time // carries a monotonic reading
	timer   *time.Timer
}

type sharedWaiter struct {
	req  driver.SharedRequest
	done chan struct{} // closed once decided; token and err are then set
	// Set under Store.mu before done is closed.
	token uint64
	err   error
}

func checkShared(mode driver.SharedMode) error {
	if err := driver.CheckMode(mode); err != nil {
		return fmt.Errorf("mem: %w", err)
	}
	return nil
}

func checkRequest(req driver.SharedRequest) error {
	if err := checkShared(req.Mode); err != nil {
		return err
	}
	if err := checkTTL(req.TTL); err != nil {
		return err
	}
	if err := driver.CheckLimit(req); err != nil {
		return fmt.Errorf("mem: %w", err)
	}
	return nil
}

// sharedLocked returns the lock for (mode's namespace, key) after settling
// it: expired holders dropped and the queue granted as far as it goes. It
// creates the lock when create is set, and may return nil otherwise. s.mu
// is held.
func (s *Store) sharedLocked(key string, mode driver.SharedMode, create bool) (sharedID, *sharedLock) {
	id := sharedID{rw: mode.RW(), key: key}
	sl := s.shared[id]
	if sl == nil {
		if !create {
			return id, nil
		}
		if s.shared == nil {
			s.shared = map[sharedID]*sharedLock{}
		}
		sl = &sharedLock{holders: map[string]*sharedHold{}}
		s.shared[id] = sl
	}
	s.settleLocked(id, sl, time.Now())
	return id, sl
}

// settleLocked drops the expired holders of sl and grants its queue from the
// head while the head fits. s.mu is held.
func (s *Store) settleLocked(id sharedID, sl *sharedLock, now time.Time) {
	for owner, h := range sl.holders {
		if !now.Before(h.expires) {
			h.timer.Stop()
			delete(sl.holders, owner)
		}
	}
	for len(sl.queue) > 0 {
		w := sl.queue[0]
		h := sl.holders[w.req.Owner]
		switch {
		case h != nil && h.mode == w.req.Mode:
			// The owner was granted this hold by another call meanwhile.
			s.extendLocked(h, w.req.TTL, now)
			w.token = h.token
		case h != nil:
			w.err = upgradeErr(h.mode, w.req.Mode)
		case sl.fits(w.req):
			w.token = s.grantLocked(id, sl, w.req, now)
		default:
			return
		}
		sl.queue = sl.queue[1:]
		close(w.done)
	}
}

// fits reports whether req can be granted beside sl's holders.
func (sl *sharedLock) fits(req driver.SharedRequest) bool {
	switch req.Mode {
	case driver.SharedPermit:
		return len(sl.holders) < req.Limit
	case driver.SharedRead:
		for _, h := range sl.holders {
			if h.mode == driver.SharedWrite {
				return false
			}
		}
		return true
	default:
		return len(sl.holders) == 0
	}
}

func upgradeErr(held, want driver.SharedMode) error {
	return fmt.Errorf("mem: %w: the owner holds the %s lock and asks for the %s lock; "+
		"there are no upgrades or downgrades: release it first", driver.ErrInvalid, held, want)
}

// grantLocked makes a new grant of req with the next token. s.mu is held.
func (s *Store) grantLocked(id sharedID, sl *sharedLock, req driver.SharedRequest, now time.Time) uint64 {
	s.counter++
	h := &sharedHold{mode: req.Mode, token: s.counter, expires: now.Add(req.TTL)}
	h.timer = time.AfterFunc(req.TTL, func() { s.expireShared(id, req.Owner, h) })
	sl.holders[req.Owner] = h
	return h.token
}

func (s *Store) extendLocked(h *sharedHold, ttl time.Duration, now time.Time) {
	h.expires = now.Add(ttl)
	h.timer.Reset(ttl)
}

func (s *Store) expireShared(id sharedID, owner string, h *sharedHold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.shared[id]
	if sl == nil || sl.holders[owner] != h {
		return
	}
	s.settleLocked(id, sl, time.Now())
	s.tidyLocked(id, sl)
}

// tidyLocked forgets sl once it has neither holders nor waiters. s.mu is
// held.
func (s *Store) tidyLocked(id sharedID, sl *sharedLock) {
	if len(sl.holders) == 0 && len(sl.queue) == 0 {
		delete(s.shared, id)
	}
}

// AcquireShared implements driver.SharedLocker.
func (c *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if err := c.check(ctx, key); err != nil {
		return 0, err
	}
	if err := checkRequest(req); err != nil {
		return 0, err
	}
	s := c.s
	s.mu.Lock()
	id, sl := s.sharedLocked(key, req.Mode, true)
	now := time.Now()
	if h := sl.holders[req.Owner]; h != nil {
		defer s.mu.Unlock()
		if h.mode != req.Mode {
			return 0, upgradeErr(h.mode, req.Mode)
		}
		s.extendLocked(h, req.TTL, now)
		return h.token, nil
	}
	if len(sl.queue) == 0 && sl.fits(req) {
		defer s.mu.Unlock()
		return s.grantLocked(id, sl, req, now), nil
	}
	if !req.Wait {
		defer s.mu.Unlock()
		s.tidyLocked(id, sl)
		return 0, fmt.Errorf("mem: %w", driver.ErrNotAcquired)
	}
	w := &sharedWaiter{req: req, done: make(chan struct{})}
	sl.queue = append(sl.queue, w)
	s.mu.Unlock()
	select {
	case <-w.done:
		return w.token, w.err
	case <-ctx.Done():
		return 0, s.abandon(id, w, ctx.Err())
	}
}

// abandon takes w out of its queue after its ctx ended, or undoes its grant
// if it was granted meanwhile, so that nothing is left held or queued.
func (s *Store) abandon(id sharedID, w *sharedWaiter, cerr error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sl := s.shared[id]
	if sl == nil {
		return fmt.Errorf("mem: %w", cerr)
	}
	select {
	case <-w.done:
		if h := sl.holders[w.req.Owner]; w.err == nil && h != nil && h.token == w.token {
			h.timer.Stop()
			delete(sl.holders, w.req.Owner)
		}
	default:
		if i := slices.Index(sl.queue, w); i >= 0 {
			sl.queue = slices.Delete(sl.queue, i, i+1)
		}
	}
	// A writer leaving the head of the queue may let readers in.
	s.settleLocked(id, sl, time.Now())
	s.tidyLocked(id, sl)
	return fmt.Errorf("mem: %w", cerr)
}

// holdOf returns owner's live hold of key in mode, or an error wrapping
// driver.ErrNotHeld. s.mu is held.
func (s *Store) holdOf(key string, mode driver.SharedMode, owner string) (sharedID, *sharedLock, *sharedHold, error) {
	id, sl := s.sharedLocked(key, mode, false)
	if sl == nil {
		return id, nil, nil, fmt.Errorf("mem: %w", driver.ErrNotHeld)
	}
	h := sl.holders[owner]
	if h == nil || h.mode != mode {
		s.tidyLocked(id, sl)
		return id, sl, nil, fmt.Errorf("mem: %w", driver.ErrNotHeld)
	}
	return id, sl, h, nil
}

// RefreshShared implements driver.SharedLocker.
func (c *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if err := c.check(ctx, key); err != nil {
		return err
	}
	if err := checkShared(mode); err != nil {
		return err
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	_, _, h, err := s.holdOf(key, mode, owner)
	if err != nil {
		return err
	}
	s.extendLocked(h, ttl, time.Now())
	return nil
}

// ReleaseShared implements driver.SharedLocker.
func (c *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if err := c.check(ctx, key); err != nil {
		return err
	}
	if err := checkShared(mode); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	id, sl, h, err := s.holdOf(key, mode, owner)
	if err != nil {
		return err
	}
	h.timer.Stop()
	delete(sl.holders, owner)
	s.settleLocked(id, sl, time.Now())
	s.tidyLocked(id, sl)
	return nil
}

// InspectShared implements driver.SharedLocker.
func (c *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := c.check(ctx, key); err != nil {
		return nil, err
	}
	if err := checkShared(mode); err != nil {
		return nil, err
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	id, sl := s.sharedLocked(key, mode, false)
	if sl == nil {
		return nil, nil
	}
	now := time.Now()
	out := make([]driver.SharedInfo, 0, len(sl.holders))
	for owner, h := range sl.holders {
		out = append(out, driver.SharedInfo{
			Info: driver.Info{Owner: owner, Token: h.token, Remaining: h.expires.Sub(now)},
			Mode: h.mode,
		})
	}
	slices.SortFunc(out, func(a, b driver.SharedInfo) int { return cmp.Compare(a.Token, b.Token) })
	s.tidyLocked(id, sl)
	return out, nil
}
