// Package faultproxy is a TCP proxy for fault tests, run inside the test
// process: put it between a client and its server, then cut, reset, slow or
// half-close the traffic from Go code, with no daemon to install.
//
//	p, err := faultproxy.New("127.0.0.1:6379")
//	...
//	defer p.Close()
//	client := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.Blackhole() // a partition: requests hang, the server keeps its state
//	p.Heal()
//	p.Reset()     // every connection is reset (RST) on both sides
//	p.ResetSide(faultproxy.Server) // only the server sees a reset; the client hears nothing
//
// Faults apply to every connection through the proxy, the ones open now and
// the ones made later, so one proxy per client process stands for that
// process's network path. Package conformance builds its fault hooks on it.
//
// Why not toxiproxy: its v2 library pulls in an HTTP API, metrics and
// logging packages that a test-only dependency of a lock library should not
// carry, and its toxics run in a separate server process model. The faults a
// lock needs (partition, reset, latency, one side closed, refusal) fit in a
// few hundred lines of the standard library.
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Side names one of the two TCP connections a proxied connection consists
// of.
type Side int

const (
	// Client is the connection between the client and the proxy.
	Client Side = iota
	// Server is the connection between the proxy and the server.
	Server
)

func (s Side) String() string {
	if s == Client {
		return "client"
	}
	return "server"
}

// Proxy forwards TCP connections from Addr to a target address. Its methods
// are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	wg     sync.WaitGroup

	mu      sync.Mutex
	links   map[*link]struct{}
	open    chan struct{} // closed while traffic flows; replaced by Blackhole
	holed   bool
	latency time.Duration
	refuse  bool
	closed  bool
	closing chan struct{} // closed by Close
	// dialTimeout bounds the dial to the target.
	dialTimeout time.Duration
	delivered   atomic.Int64 // bytes forwarded from the target to clients
}

// New starts a proxy on a free port of 127.0.0.1 that forwards to target
// ("host:port"). The target is dialled once per accepted connection; if it
// cannot be reached, that client connection is closed. Close the proxy
// when done.
func New(target string) (*Proxy, error) {
	return Listen("127.0.0.1:0", target)
}

// Listen is New on a given listen address, for example "127.0.0.1:0" or a
// fixed port that a server's configuration names.
func Listen(addr, target string) (*Proxy, error) {
	if target == "" {
		return nil, errors.New("faultproxy: empty target address")
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	open := make(chan struct{})
	close(open)
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}, open: open, closing: make(chan struct{}), dialTimeout: 5 * time.Second}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients should dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Blackhole stands for a network partition: from now on no byte is
// forwarded in either direction, on open connections and on new ones (which
// are accepted but not connected to the target until Heal). Nothing is
// dropped: what was sent meanwhile is delivered after Heal, as TCP
// retransmission would deliver it, unless the connection was reset or
// closed first. Clients see their requests hang until their own timeouts.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.holed {
		p.holed = true
		p.open = make(chan struct{})
	}
}

// Heal ends a Blackhole: forwarding resumes where it stopped.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holed {
		p.holed = false
		close(p.open)
	}
}

// Reset breaks every open connection with a TCP reset on both sides, as a
// middlebox or a crashed host would: the client and the server each see
// "connection reset by peer". New connections are forwarded as before. It
// returns how many connections it reset.
func (p *Proxy) Reset() int {
	return p.each(func(l *link) { l.abort(Client); l.abort(Server) })
}

// ResetSide breaks one side of every open connection with a TCP reset and
// stops forwarding on it, leaving the other side's connection open and
// silent: nothing it sends is read or answered, and it sees no end until
// the proxy is closed. ResetSide(Server) is a half-open connection as a
// proxy whose backend connection died, a failover of an HA proxy, or a
// middlebox that resets only one side would leave it: the server sees
// "connection reset by peer" and ends the session, while the client's
// socket reports nothing. New connections are forwarded as before. It
// returns how many connections it reset.
func (p *Proxy) ResetSide(s Side) int {
	return p.each(func(l *link) { l.abort(s) })
}

// CloseSide closes one side of every open connection in the ordinary way
// (FIN), and stops forwarding on it: that side's peer sees the connection
// end, while the other peer's connection stays open and silent, as when a
// host or a NAT table forgets a connection. New connections are forwarded
// as before. It returns how many connections it closed.
func (p *Proxy) CloseSide(s Side) int {
	return p.each(func(l *link) { l.closeSide(s) })
}

// SetLatency delays every byte by d in each direction (so a round trip
// gains 2d), on open and new connections. Zero removes the delay. Order is
// kept.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = max(d, 0)
}

// Refuse makes the proxy reset new connections at once while on, as a
// server host whose port is closed would; open connections are untouched.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// Conns returns the number of open proxied connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Delivered returns how many bytes the proxy has forwarded from the target
// to its clients, over every connection so far: above zero once the server
// has answered through it.
func (p *Proxy) Delivered() int64 { return p.delivered.Load() }

// Close stops accepting, closes every connection and waits for the proxy's
// goroutines to end. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closing)
	if p.holed {
		p.holed = false
		close(p.open)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.each(func(l *link) { l.abort(Client); l.abort(Server) })
	p.wg.Wait()
	return err
}

func (p *Proxy) each(fn func(*link)) int {
	p.mu.Lock()
	ls := make([]*link, 0, len(p.links))
	for l := range p.links {
		ls = append(ls, l)
	}
	p.mu.Unlock()
	for _, l := range ls {
		fn(l)
	}
	return len(ls)
}

// gate returns the channel that is closed while traffic may flow, and the
// latency in force.
func (p *Proxy) gate() (<-chan struct{}, time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open, p.latency
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.closed || p.refuse {
			p.mu.Unlock()
			resetConn(c)
			continue
		}
		l := newLink(p, c)
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go l.run()
	}
}

func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// link is one proxied connection: the client's conn and the conn to the
// target.
type link struct {
	p    *Proxy
	done chan struct{} // closed when the link is torn down

	mu      sync.Mutex
	conns   [2]net.Conn // by Side; conns[Server] is nil until dialled
	stopped [2]bool     // side closed or reset by a fault
	ended   bool
}

func newLink(p *Proxy, c net.Conn) *link {
	l := &link{p: p, done: make(chan struct{})}
	l.conns[Client] = c
	return l
}

func (l *link) run() {
	defer l.p.wg.Done()
	defer l.p.drop(l)
	defer l.end()

	// A new connection made during a partition waits for Heal before the
	// target is dialled, as a SYN would be retransmitted.
	open, _ := l.p.gate()
	select {
	case <-open:
	case <-l.done:
		return
	}
	s, err := net.DialTimeout("tcp", l.p.target, l.p.dialTimeout)
	if err != nil {
		resetConn(l.conns[Client])
		return
	}
	l.mu.Lock()
	if l.ended || l.stopped[Client] || l.stopped[Server] {
		l.mu.Unlock()
		resetConn(s)
		return
	}
	l.conns[Server] = s
	l.mu.Unlock()

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); l.pump(Client, Server) }()
	go func() { defer wg.Done(); l.pump(Server, Client) }()
	wg.Wait()
}

type chunk struct {
	b  []byte
	at time.Time
}

// pump copies from one side to the other, honouring the proxy's gate and
// latency. A read error or EOF on src ends the pump and half-closes dst, as
// a transparent proxy would.
func (l *link) pump(from, to Side) {
	src, dst := l.conns[from], l.conns[to]
	ch := make(chan chunk, 64)
	go func() {
		defer close(ch)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				select {
				case ch <- chunk{b[:n], time.Now()}:
				case <-l.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		for {
			open, lat := l.p.gate()
			select {
			case <-open:
			case <-l.done:
				return
			}
			if wait := time.Until(c.at.Add(lat)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-l.done:
					t.Stop()
					return
				}
				continue // the gate may have closed meanwhile
			}
			break
		}
		if l.isStopped(to) || l.isStopped(from) {
			return
		}
		n, err := dst.Write(c.b)
		if to == Client {
			l.p.delivered.Add(int64(n))
		}
		if err != nil {
			return
		}
	}
	if l.isStopped(to) || l.isStopped(from) {
		return
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

func (l *link) isStopped(s Side) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stopped[s] || l.ended
}

// abort resets side s.
func (l *link) abort(s Side) {
	l.mu.Lock()
	c := l.conns[s]
	l.stopped[s] = true
	l.mu.Unlock()
	if c != nil {
		resetConn(c)
	}
	l.stopAll()
}

// closeSide closes side s with a FIN and stops the link, leaving the other
// side's connection open until the proxy is closed.
func (l *link) closeSide(s Side) {
	l.mu.Lock()
	c := l.conns[s]
	l.stopped[s] = true
	l.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
	l.stopAll()
}

// stopAll ends forwarding; connections not stopped by a fault are closed by
// end when the proxy closes or when both pumps are done.
func (l *link) stopAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ended {
		l.ended = true
		close(l.done)
	}
}

// end tears the link down when run returns. A side left open by CloseSide
// stays open until the proxy is closed, so that its peer sees silence, not
// an end.
func (l *link) end() {
	l.stopAll()
	l.mu.Lock()
	conns, stopped := l.conns, l.stopped
	l.mu.Unlock()
	halfOpen := stopped[Client] != stopped[Server]
	for s, c := range conns {
		if c == nil || stopped[s] {
			continue
		}
		if halfOpen {
			l.p.wg.Add(1)
			go func() {
				defer l.p.wg.Done()
				<-l.p.closing
				_ = c.Close()
			}()
			continue
		}
		_ = c.Close()
	}
}

// resetConn closes c with a TCP reset rather than a FIN.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
