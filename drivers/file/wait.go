package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// Waiting. A release rewrites the key's lock file, which inotify reports to
// every process watching the directory; each subscription then re-reads the
// record and wakes if the lease it saw (or any grant since) has ended. An
// expiry changes no file, so each subscription also keeps a timer at the
// current lease's expiry, re-armed whenever the lock file is written (a
// refresh or a new grant). One inotify instance serves all subscriptions of
// a process on one directory.

// pollInterval is how often a subscription re-reads the lock file when
// inotify is unavailable (instance or watch limits reached).
const pollInterval = 50 * time.Millisecond

// Subscribe implements driver.Waiter. wake receives a value when key's lease
// is released or expires, or its lock file is removed, and on a
// directory event that may have been missed (an inotify queue overflow).
// Should inotify be unavailable it falls back to re-reading the lock file
// every 50ms. Errors: ErrInvalid for an empty key, ErrClosed after Close, and
// ctx.Err() wrapped.
func (l *Locker) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := l.check(ctx, key, "-", 0, false); err != nil {
		return nil, nil, err
	}
	s, err := l.newSubscription(key)
	if err != nil {
		return nil, nil, err
	}
	// Read the lease now, so that anything after Subscribe returns is
	// measured against it. If the flock is not had in a moment (its holder
	// is stopped), run reads it later and sends a wake-up then.
	sctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-sctx.Done():
		}
	}()
	first, known := s.read(sctx)
	cancel()
	if err := ctx.Err(); err != nil {
		s.stop(false)
		return nil, nil, fmt.Errorf("file: %w", err)
	}
	go s.run(first, known)
	return s.wake, func() { s.stop(false) }, nil
}

// newSubscription starts watching key's lock file: through the directory's
// inotify watcher if one can be had (s.w is nil otherwise), registered with
// l so that Close ends it. After Close it returns driver.ErrClosed.
func (l *Locker) newSubscription(key string) (*subscription, error) {
	path, name := l.pathName(key)
	return l.watchFile(key, path, name, false)
}

// watchFile starts a subscription to the events on the file name (at path)
// of key's lock, as newSubscription does for its mutex; with closes, to the
// closing of read-only descriptors of it instead (see subscription).
func (l *Locker) watchFile(key, path, name string, closes bool) (*subscription, error) {
	s := &subscription{
		l:      l,
		key:    key,
		path:   path,
		name:   name,
		closes: closes,
		wake:   make(chan struct{}, 1),
		poke:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	s.w = acquireWatcher(l.dir)
	if s.w != nil {
		s.w.add(s)
	}
	l.mu.Lock()
	if l.subs == nil {
		l.mu.Unlock()
		s.stop(false)
		return nil, driver.ErrClosed
	}
	l.subs[s] = struct{}{}
	l.mu.Unlock()
	return s, nil
}

type subscription struct {
	l          *Locker
	w          *watcher // nil: polling
	key, path  string
	name       string
	wake, poke chan struct{}
	done       chan struct{} // closed by stop
	once       sync.Once
	// closes makes the subscription hear only of the closing of a
	// descriptor opened read-only on its file (and of events that may have
	// been missed): a waiter's watch on the waiter ahead of it, whose
	// process closes its waiter file when it ends, however it ends.
	closes bool
	// prev and next link the subscriptions to one file name in their
	// watcher (under watcher.mu).
	prev, next *subscription
	// hold is a hold watch's check context (hold.go), reused by its checks.
	hold checkCtx
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// stop ends the subscription; final sends one last wake-up (on Close, so a
// waiter retries and learns the Locker is closed).
func (s *subscription) stop(final bool) {
	s.once.Do(func() {
		close(s.done)
		if s.w != nil {
			s.w.remove(s)
			releaseWatcher(s.w)
		}
		s.l.mu.Lock()
		delete(s.l.subs, s)
		s.l.mu.Unlock()
		if final {
			signal(s.wake)
		}
	})
}

// run keeps a timer at the expiry of the lease in the lock file. last is
// the lease read when the subscription started, if known.
func (s *subscription) run(last lease, known bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.done
		cancel()
	}()
	if !known {
		if last, known = s.read(ctx); !known {
			return // stopped
		}
		signal(s.wake)
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	arm := func(r lease) {
		if r.owner != "" {
			timer.Reset(r.remaining(now(s.l.boot)) + 100*time.Microsecond)
		}
	}
	arm(last)
	var tick <-chan time.Time
	if s.w == nil {
		t := time.NewTicker(pollInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.done:
			timer.Stop()
			return
		case <-s.poke:
		case <-timer.C:
		case <-tick:
		}
		r, ok := s.read(ctx)
		if !ok {
			return // stopped
		}
		// Wake when the key is free and a lease ended since the last read:
		// one seen in force, or another grant (a new token) that came and
		// went between two reads.
		if r.owner == "" && (last.owner != "" || r.token != last.token) {
			signal(s.wake)
		}
		last = r
		arm(r)
	}
}

// read returns the key's record, with no owner unless its lease is in
// force, or the zero lease if there is none. ok is false if ctx ended first.
func (s *subscription) read(ctx context.Context) (r lease, ok bool) {
	fd, err := flockFile(ctx, s.path, unix.LOCK_SH, false, s.l.perm)
	if err != nil {
		if ctx.Err() != nil {
			return lease{}, false
		}
		if !errors.Is(err, unix.ENOENT) {
			// Unreadable: say it may be free; the waiter's Acquire will tell.
			signal(s.wake)
		}
		return lease{}, true
	}
	defer unix.Close(fd)
	r, ok, err = readLease(fd)
	if err != nil || !ok || r.key != s.key {
		return lease{}, true
	}
	if !r.held(now(s.l.boot)) {
		r.owner = ""
	}
	return r, true
}

// watcher is one inotify instance watching one directory for this process.
type watcher struct {
	dir  string
	f    *os.File
	refs int         // guarded by watchersMu
	idle *time.Timer // closes the watcher when unused; guarded by watchersMu

	mu   sync.Mutex
	subs map[string]*subscription // the first of each name's list (subscription.next)
}

var (
	watchersMu sync.Mutex
	watchers   = map[string]*watcher{}
)

// watcherLinger is how long an unused watcher is kept for the next
// subscription.
const watcherLinger = 5 * time.Second

// noInotify forces polling (tests).
var noInotify bool

// acquireWatcher returns the directory's watcher, starting it if needed, or
// nil if inotify cannot be used.
func acquireWatcher(dir string) *watcher {
	watchersMu.Lock()
	defer watchersMu.Unlock()
	if w := watchers[dir]; w != nil {
		w.refs++
		if w.idle != nil {
			w.idle.Stop() // kept for the next linger; its function re-checks refs
		}
		return w
	}
	if noInotify {
		return nil
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil
	}
	const mask = unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MODIFY | unix.IN_CLOSE_NOWRITE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil
	}
	w := &watcher{dir: dir, f: os.NewFile(uintptr(fd), "inotify"), refs: 1, subs: map[string]*subscription{}}
	watchers[dir] = w
	go w.loop()
	return w
}

func releaseWatcher(w *watcher) {
	watchersMu.Lock()
	defer watchersMu.Unlock()
	w.refs--
	if w.refs > 0 {
		return
	}
	if watchers[w.dir] != w { // replaced after its directory went away
		go w.f.Close()
		return
	}
	// Keep an idle watcher a while: closing an inotify instance takes the
	// kernel milliseconds, and the next wait on the directory is likely soon.
	// The timer is made once and reset at each linger.
	if w.idle != nil {
		w.idle.Reset(watcherLinger)
		return
	}
	w.idle = time.AfterFunc(watcherLinger, func() {
		watchersMu.Lock()
		defer watchersMu.Unlock()
		// A subscription that came since keeps it; one that came and
		// went has reset the timer, which fires again.
		if w.refs == 0 && watchers[w.dir] == w {
			delete(watchers, w.dir)
			w.f.Close() // ends loop
		}
	})
}

func (w *watcher) add(s *subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.prev, s.next = nil, w.subs[s.name]
	if s.next != nil {
		s.next.prev = s
	}
	w.subs[s.name] = s
}

// remove unlinks s, which add linked (once).
func (w *watcher) remove(s *subscription) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case s.prev != nil:
		s.prev.next = s.next
	case s.next != nil:
		w.subs[s.name] = s.next
	default:
		delete(w.subs, s.name)
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next = nil, nil
}

// Kinds of event the watcher delivers.
const (
	evChanged = iota // the file was written: its subscriptions re-read it
	evFreed          // removed, or an event may have been missed: also wake
	evClosed         // a read-only descriptor of it was closed
)

// notify delivers an event of kind ev for name (empty for every
// subscription). A closing reaches only the subscriptions that ask for it
// (closes), and they hear of nothing else but events that may hide one.
func (w *watcher) notify(name []byte, ev int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	deliver := func(s *subscription) {
		for ; s != nil; s = s.next {
			if len(name) != 0 && s.closes != (ev == evClosed) {
				continue
			}
			if ev == evFreed {
				signal(s.wake)
			}
			signal(s.poke)
		}
	}
	if len(name) != 0 {
		deliver(w.subs[string(name)])
		return
	}
	for _, s := range w.subs {
		deliver(s)
	}
}

func (w *watcher) loop() {
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				w.notify(nil, evFreed) // cannot watch any more: let waiters re-check
			}
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			name := trimNUL(nameBytes) // looked up without a copy
			switch {
			case ev.Mask&unix.IN_IGNORED != 0:
				// The directory is gone or moved: no more events will come.
				// Later subscriptions start a new watcher.
				watchersMu.Lock()
				if watchers[w.dir] == w {
					delete(watchers, w.dir)
				}
				watchersMu.Unlock()
				w.notify(nil, evFreed)
			case ev.Mask&(unix.IN_Q_OVERFLOW|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
				w.notify(nil, evFreed)
			case len(name) == 0:
			case ev.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
				w.notify(name, evFreed)
			case ev.Mask&unix.IN_MODIFY != 0:
				w.notify(name, evChanged)
			case ev.Mask&unix.IN_CLOSE_NOWRITE != 0:
				w.notify(name, evClosed)
			}
		}
	}
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
