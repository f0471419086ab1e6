package locker

import (
	"sync"
	"time"
)

// One scheduler per Locker serves the timed events of all its locks: the
// safe deadline (Lost), WithMaxHold's bound and the next automatic
// renewal. It is a min-heap of due times served by one goroutine, started
// with the first event and stopped by Close. That goroutine does no I/O and
// takes no Lock's mutex: each due event runs on a goroutine of its own
// (Lock.expire closes Lost; Lock.renewOnce renews), deadlines before the
// renewals due in the same pass, so a slow renewal round trip delays no
// deadline.
type scheduler struct {
	mu      sync.Mutex
	heap    []*event
	started bool
	next    time.Time // when the goroutine wakes next, at the latest
	stopped bool
	wake    chan struct{} // buffered: the earliest due time moved earlier
	quit    chan struct{} // closed by stop
	done    chan struct{} // closed when the goroutine has returned
}

// eventKind says what a due event does to its lock.
type eventKind uint8

const (
	evDeadline eventKind = iota // the safe deadline: Lost closes (expire)
	evMaxHold                   // WithMaxHold's bound (expire)
	evRenew                     // the next automatic renewal (renewOnce)
	numEvents
)

// event is one timed event of one lock, embedded in the Lock: scheduling
// allocates nothing.
type event struct {
	lk   *Lock
	kind eventKind
	at   time.Time
	i    int // index in the heap; -1 when not scheduled
}

func newScheduler() *scheduler {
	return &scheduler{wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
}

// schedule makes e due at at, in place of any earlier schedule of it.
// After stop it does nothing.
func (s *scheduler) schedule(e *event, at time.Time) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	if !s.started {
		s.started = true
		go s.run()
	}
	e.at = at
	if e.i >= 0 {
		s.fix(e.i)
	} else {
		e.i = len(s.heap)
		s.heap = append(s.heap, e)
		s.up(e.i)
	}
	// The goroutine is woken only when e is due before it would wake
	// anyway.
	wake := e.i == 0 && at.Before(s.next)
	if wake {
		s.next = at
	}
	s.mu.Unlock()
	if wake {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// cancel unschedules the events es that are scheduled, in one step.
func (s *scheduler) cancel(es []event) {
	s.mu.Lock()
	for k := range es {
		if i := es[k].i; i >= 0 {
			s.remove(i)
		}
	}
	s.mu.Unlock()
}

// stop ends the goroutine and drops every event; later schedules do
// nothing.
func (s *scheduler) stop() {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return
	}
	s.stopped = true
	for _, e := range s.heap {
		e.i = -1
	}
	s.heap = nil
	started := s.started
	s.mu.Unlock()
	close(s.quit)
	if started {
		<-s.done
	}
}

// run serves the heap: it fires what is due, then sleeps until the next
// due time, an earlier event, or stop.
func (s *scheduler) run() {
	defer close(s.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var due []*event
	for {
		s.mu.Lock()
		now := time.Now()
		for len(s.heap) > 0 && !s.heap[0].at.After(now) {
			e := s.heap[0]
			s.remove(0)
			due = append(due, e)
		}
		s.next = now.Add(time.Hour)
		if len(s.heap) > 0 {
			s.next = s.heap[0].at
		}
		next := s.next
		s.mu.Unlock()
		for _, e := range due {
			if e.kind != evRenew {
				go e.lk.expire(e.kind)
			}
		}
		for i, e := range due {
			if e.kind == evRenew {
				go e.lk.renewOnce()
			}
			due[i] = nil
		}
		due = due[:0]
		t.Reset(time.Until(next))
		select {
		case <-t.C:
		case <-s.wake:
		case <-s.quit:
			return
		}
	}
}

// The heap's operations; s.mu is held.

func (s *scheduler) less(i, j int) bool { return s.heap[i].at.Before(s.heap[j].at) }

func (s *scheduler) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	h[i].i, h[j].i = i, j
}

func (s *scheduler) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *scheduler) down(i int) bool {
	start, n := i, len(s.heap)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && s.less(r, c) {
			c = r
		}
		if !s.less(c, i) {
			break
		}
		s.swap(i, c)
		i = c
	}
	return i > start
}

func (s *scheduler) fix(i int) {
	if !s.down(i) {
		s.up(i)
	}
}

func (s *scheduler) remove(i int) {
	n := len(s.heap) - 1
	e := s.heap[i]
	if i != n {
		s.swap(i, n)
	}
	s.heap[n] = nil
	s.heap = s.heap[:n]
	if i != n {
		s.fix(i)
	}
	e.i = -1
}
