package conformance_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"sync"
	"time"
)

// tcpServer is the TCP reference driver's lock server: it runs in the test
// process, on a port of 127.0.0.1, and speaks the protocol of
// tcpref_proto_test.go. Leases count on the server's clock (this process's
// monotonic clock), from the moment a request is read. Tokens come from one
// counter that every grant increments, so they increase per key; the counter
// is kept apart from the leases, as a durable sequence would be, and
// survives both kinds of restart (the driver declares DurableTokens).
type tcpServer struct {
	addr string
	is   func(flaw string) bool

	mu       sync.Mutex
	ln       net.Listener // nil while stopped
	conns    map[*srvConn]struct{}
	leases   map[string]*srvLease
	counter  uint64
	subs     map[string]map[subRef]struct{} // by key
	ghosts   map[string]*srvLease           // tcp-inspect-ghost-after-empty-restart
	subsFrom time.Time                      // tcp-waiter-deaf-after-restart
	wg       sync.WaitGroup                 // the accept loop and every connection's
}

type srvLease struct {
	owner   string
	token   uint64
	expires time.Time
}

type subRef struct {
	c   *srvConn
	sid uint64
}

// srvConn is one client connection. Replies are written by the
// connection's goroutine, wake-ups by whichever goroutine released a key,
// so writes hold wmu.
type srvConn struct {
	c    net.Conn
	wmu  sync.Mutex
	sids map[uint64]string // subscriptions made on this connection; tcpServer.mu
}

// startTCPServer starts a server on a free port of 127.0.0.1.
func startTCPServer(is func(string) bool) (*tcpServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &tcpServer{addr: ln.Addr().String(), is: is, conns: map[*srvConn]struct{}{},
		leases: map[string]*srvLease{}, subs: map[string]map[subRef]struct{}{}}
	s.serve(ln)
	return s, nil
}

func (s *tcpServer) serve(ln net.Listener) {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	s.wg.Add(1)
	go s.accept(ln)
}

func (s *tcpServer) accept(ln net.Listener) {
	defer s.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		sc := &srvConn{c: c, sids: map[uint64]string{}}
		s.mu.Lock()
		if s.ln != ln { // stopped since Accept returned
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns[sc] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.handle(sc)
	}
}

// handle answers one connection's requests in order until it ends.
func (s *tcpServer) handle(sc *srvConn) {
	defer s.wg.Done()
	defer s.drop(sc)
	r := bufio.NewReader(sc.c)
	for {
		req, err := readFrame(r)
		if err != nil {
			return
		}
		reply, wake := s.do(sc, req)
		if sc.write(reply...) != nil {
			return
		}
		for _, ref := range wake {
			_ = ref.c.write(u64(0), []byte("WAKE"), u64(ref.sid))
		}
	}
}

// write sends one frame; a peer that cannot take it within 2s (a client
// cut off with full buffers) loses its connection.
func (sc *srvConn) write(fields ...[]byte) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	_ = sc.c.SetWriteDeadline(time.Now().Add(2 * time.Second))
	err := writeFrame(sc.c, fields...)
	if err != nil {
		_ = sc.c.Close()
	}
	return err
}

// drop forgets a connection that ended, and its subscriptions.
func (s *tcpServer) drop(sc *srvConn) {
	_ = sc.c.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, sc)
	for sid, key := range sc.sids {
		delete(s.subs[key], subRef{sc, sid})
	}
}

// stop closes the listener and every connection, and waits for their
// goroutines.
func (s *tcpServer) stop() {
	s.mu.Lock()
	ln := s.ln
	s.ln = nil
	conns := maps.Clone(s.conns)
	s.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	for sc := range conns {
		_ = sc.c.Close()
	}
	s.wg.Wait()
}

// Close stops the server for good.
func (s *tcpServer) Close() { s.stop() }

// restartDowntime is how long a restart keeps the port closed.
const restartDowntime = 50 * time.Millisecond

// Restart is the Harness's Restart (empty false) and RestartEmpty (empty
// true): every connection ends, the port is closed for restartDowntime,
// and the server listens again on the same port. Without empty, leases are
// kept and keep counting on the server's clock; with empty, they are gone.
// The token counter survives both. It returns once the server accepts
// connections.
func (s *tcpServer) Restart(ctx context.Context, empty bool) error {
	s.stop()
	s.mu.Lock()
	now := time.Now()
	switch {
	case empty && s.is("tcp-inspect-ghost-after-empty-restart"):
		s.ghosts, s.leases = s.leases, map[string]*srvLease{} // Inspect reads a copy the restart did not empty
	case empty:
		s.leases = map[string]*srvLease{}
	case s.is("tcp-restart-renumbers-tokens"):
		for _, l := range s.leases { // the tokens were not in the reloaded snapshot
			s.counter++
			l.token = s.counter
		}
	}
	if s.is("tcp-waiter-deaf-after-restart") {
		s.subsFrom = now.Add(5 * time.Second) // pub/sub comes up after the lock store
	}
	s.mu.Unlock()
	time.Sleep(restartDowntime)
	for {
		ln, err := net.Listen("tcp", s.addr)
		if err == nil {
			s.serve(ln)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tcpref: listening again on %s: %w", s.addr, errors.Join(err, ctx.Err()))
		case <-time.After(10 * time.Millisecond): // the port is still in use: retry until ctx ends
		}
	}
}
