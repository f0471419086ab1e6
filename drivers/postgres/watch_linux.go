//go:build linux

package postgres

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// sessionWatcher tells, without any traffic, when the server ends a pinned
// session: it waits in one epoll instance, on one goroutine per Locker, for
// the peer-closed (EPOLLRDHUP), hang-up and error conditions of the pinned
// sockets. It never asks for readability, so a reply to a statement of our
// own wakes nothing, and it never reads, so it cannot take bytes pgx
// expects. The server closes a session's socket after it has released the
// session's locks (a terminated backend), or once its shared lock table is
// gone (a crash of any backend, an immediate shutdown); a reset connection
// can never carry a statement again. Either way the lock is lost to its
// holder the moment the event arrives.
//
// Registrations are made and removed inside syscall.RawConn.Control, while
// the runtime guarantees the descriptor still names our socket; a socket
// closed by pgx drops out of the epoll set by itself.
type sessionWatcher struct {
	epfd, evfd int

	mu      sync.Mutex
	closed  bool
	next    uint64
	watches map[uint64]*sessionWatch
	done    chan struct{}
}

// sessionWatch is one watched socket.
type sessionWatch struct {
	w    *sessionWatcher
	id   uint64
	rc   syscall.RawConn
	h    *hold
	gone func(*hold, error) // called with h at most once, from the watcher's goroutine

	// ctl runs the epoll_ctl op on the socket, inside rc.Control; made once
	// for the registration and its removal, it sets ctlErr.
	ctl    func(fd uintptr)
	op     int
	ctlErr error
}

const watchEvents = unix.EPOLLRDHUP | unix.EPOLLONESHOT // EPOLLHUP and EPOLLERR are always reported

func newSessionWatcher() (*sessionWatcher, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("postgres: epoll_create1: %w", err)
	}
	evfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("postgres: eventfd: %w", err)
	}
	// Id 0 is the wake-up for Close.
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, evfd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(evfd)
		unix.Close(epfd)
		return nil, fmt.Errorf("postgres: epoll_ctl: %w", err)
	}
	w := &sessionWatcher{epfd: epfd, evfd: evfd, watches: map[uint64]*sessionWatch{}, done: make(chan struct{})}
	go w.loop()
	return w, nil
}

// add watches conn (a pgx connection's net.Conn, possibly TLS), h's
// session. gone is called once, with h, if the peer closes or resets it
// before remove.
func (w *sessionWatcher) add(conn net.Conn, gone func(*hold, error), h *hold) (*sessionWatch, error) {
	for {
		u, ok := conn.(interface{ NetConn() net.Conn })
		if !ok {
			break
		}
		conn = u.NetConn()
	}
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("postgres: cannot watch a %T: %w", conn, errors.ErrUnsupported)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("postgres: watching the session: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, errors.New("postgres: watcher closed")
	}
	w.next++
	sw := &sessionWatch{w: w, id: w.next, rc: rc, h: h, gone: gone, op: unix.EPOLL_CTL_ADD}
	sw.ctl = func(fd uintptr) {
		ev := unix.EpollEvent{Events: watchEvents, Fd: int32(uint32(sw.id)), Pad: int32(uint32(sw.id >> 32))}
		sw.ctlErr = unix.EpollCtl(sw.w.epfd, sw.op, int(fd), &ev)
	}
	err = rc.Control(sw.ctl)
	if err == nil {
		err = sw.ctlErr
	}
	if err != nil {
		return nil, fmt.Errorf("postgres: watching the session: %w", err)
	}
	w.watches[sw.id] = sw
	return sw, nil
}

// remove ends the watch; gone is not called afterwards unless the event was
// already being delivered. It may be called more than once.
func (sw *sessionWatch) remove() {
	w := sw.w
	w.mu.Lock()
	_, ok := w.watches[sw.id]
	delete(w.watches, sw.id)
	w.mu.Unlock()
	if ok {
		sw.unregister()
	}
}

// unregister removes the socket from the epoll set, unless it is closed
// already (then the kernel has removed it).
func (sw *sessionWatch) unregister() {
	sw.op = unix.EPOLL_CTL_DEL
	_ = sw.rc.Control(sw.ctl)
}

// close stops the goroutine and releases the epoll instance. Watches still
// registered are dropped without being reported.
func (w *sessionWatcher) close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	w.watches = map[uint64]*sessionWatch{}
	w.mu.Unlock()
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(w.evfd, one[:])
	<-w.done
	unix.Close(w.evfd)
	unix.Close(w.epfd)
}

func (w *sessionWatcher) loop() {
	defer close(w.done)
	events := make([]unix.EpollEvent, 32)
	for {
		n, err := unix.EpollWait(w.epfd, events, -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		for _, ev := range events[:n] {
			id := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			w.mu.Lock()
			if w.closed {
				w.mu.Unlock()
				return
			}
			sw := w.watches[id]
			delete(w.watches, id)
			w.mu.Unlock()
			if sw == nil {
				continue
			}
			sw.unregister()
			sw.gone(sw.h, sw.cause(ev.Events))
		}
	}
}

// cause describes what the socket reported.
func (sw *sessionWatch) cause(events uint32) error {
	if events&unix.EPOLLERR != 0 {
		var soErr int
		_ = sw.rc.Control(func(fd uintptr) {
			soErr, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
		})
		if soErr != 0 {
			return fmt.Errorf("the session's connection failed: %w", syscall.Errno(soErr))
		}
		return errors.New("the session's connection failed")
	}
	return errors.New("the server closed the session's connection")
}
