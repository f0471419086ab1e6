package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker/driver"
)

// tcpLocker is the TCP reference driver: a driver.Locker (with Inspector,
// Waiter, Pinger and Capable) on the server of tcpref_server_test.go. It is
// the example a driver author copies; the harness that runs the
// conformance suite on it, with every fault hook, is in tcpref_test.go.
//
// It keeps one connection (a session) and pipelines every call on it, each
// with an id that its reply carries. One connection keeps the calls of a
// Locker in order: an Acquire whose caller gave up (its context ended under
// a cut) still reaches the server before the Release that package locker
// sends to clean it up. A call whose context ends returns at once; its
// reply, if one comes, is dropped. A broken connection fails the calls in
// flight with a transient error, and the next call dials again. While any
// subscription is open, a background loop re-dials at once, re-subscribes,
// and, once the server has confirmed, wakes every subscriber once (a
// release may have been missed meanwhile); the same loop runs while any
// grant is watched (WatchHold), and re-checks each.
type tcpLocker struct {
	addr string
	is   func(flaw string) bool
	ids  atomic.Uint64

	mu        sync.Mutex
	sess      *tcpSession // nil until dialled, and after it broke
	closed    bool
	quit      chan struct{} // closed by Close
	subs      map[uint64]*tcpSub
	redialing bool
	dialed    int
	watches   map[uint64]*tcpWatch
	believed  map[string]tcpBelief // tcp-reset-reasserts
}

type tcpSub struct {
	key  string
	wake chan struct{}
}

// tcpBelief is a grant the tcp-reset-reasserts flaw remembers.
type tcpBelief struct {
	owner string
	ttl   time.Duration
}

// tcpSession is one connection and the calls waiting for its replies.
type tcpSession struct {
	conn net.Conn
	wmu  sync.Mutex
	mu   sync.Mutex
	wait map[uint64]chan [][]byte
	dead chan struct{} // closed when the connection broke; err says why
	err  error
}

// openTCP returns a Locker on the server at addr; it dials on first use.
func openTCP(addr string, is func(string) bool) *tcpLocker {
	return &tcpLocker{addr: addr, is: is, quit: make(chan struct{}), subs: map[uint64]*tcpSub{}, watches: map[uint64]*tcpWatch{}, believed: map[string]tcpBelief{}}
}

// session returns the live session, dialling one if there is none.
func (l *tcpLocker) session(ctx context.Context) (*tcpSession, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, fmt.Errorf("tcpref: %w", driver.ErrClosed)
	}
	if s := l.sess; s != nil && s.alive() {
		return s, nil
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", l.addr)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("tcpref: dialling %s: %w", l.addr, ctx.Err())
	}
	if err != nil {
		return nil, fmt.Errorf("tcpref: %w: %w", driver.ErrUnavailable, err)
	}
	s := &tcpSession{conn: conn, wait: map[uint64]chan [][]byte{}, dead: make(chan struct{})}
	l.sess = s
	l.dialed++
	go l.read(s)
	l.restoreLocked(s)
	return s, nil
}

// read delivers the session's replies and wake-ups until it breaks.
func (l *tcpLocker) read(s *tcpSession) {
	r := bufio.NewReader(s.conn)
	for {
		f, err := readFrame(r)
		if err == nil && len(f) < 2 {
			err = errors.New("tcpref: short frame")
		}
		if err != nil {
			s.fail(err)
			l.lost(s)
			return
		}
		id, _ := num(f[0])
		if id == 0 && string(f[1]) == "WAKE" && len(f) == 3 {
			sid, _ := num(f[2])
			l.wake(sid)
			continue
		}
		s.mu.Lock()
		ch := s.wait[id]
		delete(s.wait, id)
		s.mu.Unlock()
		if ch != nil {
			ch <- f[1:]
		}
	}
}

func (s *tcpSession) alive() bool {
	select {
	case <-s.dead:
		return false
	default:
		return true
	}
}

// fail ends the session: its calls in flight fail with err.
func (s *tcpSession) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
		close(s.dead)
		_ = s.conn.Close()
	}
}

// send writes one request and returns the channel its reply arrives on.
func (s *tcpSession) send(id uint64, op string, args ...[]byte) (<-chan [][]byte, error) {
	ch := make(chan [][]byte, 1)
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, s.err
	}
	s.wait[id] = ch
	s.mu.Unlock()
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := writeFrame(s.conn, append([][]byte{u64(id), []byte(op)}, args...)...); err != nil {
		s.fail(err)
		return nil, err
	}
	return ch, nil
}

// forget drops the wait for a reply nobody will read.
func (s *tcpSession) forget(id uint64) {
	s.mu.Lock()
	delete(s.wait, id)
	s.mu.Unlock()
}

// call makes one request and returns the reply's status and values. Its
// errors are transient (the connection broke, ctx ended: wrapping
// ctx.Err()), ErrClosed or ErrUnavailable.
func (l *tcpLocker) call(ctx context.Context, op string, args ...[]byte) (string, [][]byte, error) {
	if err := ctx.Err(); err != nil {
		return "", nil, fmt.Errorf("tcpref: %s: %w", op, err)
	}
	s, err := l.session(ctx)
	if err != nil {
		return "", nil, err
	}
	id := l.ids.Add(1)
	ch, err := s.send(id, op, args...)
	if err != nil {
		return "", nil, fmt.Errorf("tcpref: %s: connection lost: %w", op, err)
	}
	select {
	case f := <-ch:
		return string(f[0]), f[1:], nil
	case <-s.dead:
		return "", nil, fmt.Errorf("tcpref: %s: connection lost: %w", op, s.err)
	case <-ctx.Done():
		s.forget(id)
		return "", nil, fmt.Errorf("tcpref: %s: %w", op, ctx.Err())
	}
}
