package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echoServer echoes lines and reports how each server-side connection ended.
type echoServer struct {
	ln    net.Listener
	ended chan error // one value per connection: nil for EOF, else the error
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, ended: make(chan error, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, err := io.Copy(c, c)
				e.ended <- err
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return e
}

func newProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// refused reports whether a new connection through p ends without an echo
// (refused, reset or closed, at connect or at the first read), rather than
// hanging.
func refused(p *Proxy) error {
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		return nil // reset before connect returned
	}
	defer c.Close()
	got, err := roundTrip(c, bufio.NewReader(c), "x", 5*time.Second)
	switch {
	case err == nil:
		return errors.New("echoed " + got)
	case isTimeout(err):
		return errors.New("the connection hung")
	}
	return nil
}

// roundTrip sends a line and reads the echo, with a read deadline.
func roundTrip(c net.Conn, r *bufio.Reader, msg string, within time.Duration) (string, error) {
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	_ = c.SetReadDeadline(time.Now().Add(within))
	defer c.SetReadDeadline(time.Time{})
	s, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return s[:len(s)-1], nil
}

func mustEcho(t *testing.T, c net.Conn, r *bufio.Reader, msg string) {
	t.Helper()
	got, err := roundTrip(c, r, msg, 5*time.Second)
	if err != nil || got != msg {
		t.Fatalf("echo %q: got %q, %v", msg, got, err)
	}
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

func TestForwards(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "hello")
	if p.Conns() != 1 {
		t.Fatalf("Conns = %d, want 1", p.Conns())
	}
	if p.Target() != e.ln.Addr().String() {
		t.Fatal(p.Target())
	}
}

// A blackhole holds traffic on open and new connections; Heal delivers what
// was held, in order.
func TestBlackholeAndHeal(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "before")

	p.Blackhole()
	if _, err := roundTrip(c, r, "held", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("request through a blackhole: got %v, want a read timeout", err)
	}
	c2, r2 := dial(t, p) // a new connection during the partition
	if _, err := roundTrip(c2, r2, "new", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection through a blackhole: got %v, want a read timeout", err)
	}

	p.Heal()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if s, err := r.ReadString('\n'); err != nil || s != "held\n" {
		t.Fatalf("after Heal: got %q, %v; want the held request's echo", s, err)
	}
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if s, err := r2.ReadString('\n'); err != nil || s != "new\n" {
		t.Fatalf("new connection after Heal: got %q, %v", s, err)
	}
	mustEcho(t, c, r, "after")
}

// Reset breaks the connection on both sides with a TCP reset.
func TestReset(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	if n := p.Reset(); n != 1 {
		t.Fatalf("Reset reset %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after Reset: %v, want ECONNRESET", err)
	}
	select {
	case err := <-e.ended:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("server side ended with %v, want ECONNRESET", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server side did not see the reset")
	}
	// New connections still work.
	c2, r2 := dial(t, p)
	mustEcho(t, c2, r2, "y")
}

// CloseSide(Client): the client sees the end, the server sees nothing until
// the proxy is closed.
func TestCloseClientSide(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	if n := p.CloseSide(Client); n != 1 {
		t.Fatalf("CloseSide closed %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Fatalf("client read after CloseSide(Client): %v, want EOF", err)
	}
	select {
	case err := <-e.ended:
		t.Fatalf("server side ended (%v) although only the client side was closed", err)
	case <-time.After(200 * time.Millisecond):
	}
	_ = p.Close()
	select {
	case <-e.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("server side still open after the proxy closed")
	}
}

// CloseSide(Server): the server sees the end, the client sees silence.
func TestCloseServerSide(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	p.CloseSide(Server)
	select {
	case err := <-e.ended:
		if err != nil {
			t.Fatalf("server side ended with %v, want EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server side did not see the close")
	}
	if _, err := roundTrip(c, r, "lost", 200*time.Millisecond); !isTimeout(err) {
		t.Fatalf("client after CloseSide(Server): %v, want silence (a read timeout)", err)
	}
}

// ResetSide(Server): the server sees a reset, the client sees silence: its
// requests are neither answered nor refused, and its socket does not end.
func TestResetServerSide(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	if n := p.ResetSide(Server); n != 1 {
		t.Fatalf("ResetSide reset %d connections, want 1", n)
	}
	select {
	case err := <-e.ended:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("server side ended with %v, want ECONNRESET", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server side did not see the reset")
	}
	for i := range 3 {
		if _, err := roundTrip(c, r, "lost", 200*time.Millisecond); !isTimeout(err) {
			t.Fatalf("client request %d after ResetSide(Server): %v, want silence (a read timeout)", i, err)
		}
	}
	// New connections still work.
	c2, r2 := dial(t, p)
	mustEcho(t, c2, r2, "y")
	_ = p.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("client read after the proxy closed: %v, want the connection to end", err)
	}
}

// ResetSide(Client): the client sees a reset, the server sees nothing until
// the proxy is closed.
func TestResetClientSide(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	if n := p.ResetSide(Client); n != 1 {
		t.Fatalf("ResetSide reset %d connections, want 1", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.ReadString('\n'); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read after ResetSide(Client): %v, want ECONNRESET", err)
	}
	select {
	case err := <-e.ended:
		t.Fatalf("server side ended (%v) although only the client side was reset", err)
	case <-time.After(200 * time.Millisecond):
	}
	_ = p.Close()
	select {
	case <-e.ended:
	case <-time.After(5 * time.Second):
		t.Fatal("server side still open after the proxy closed")
	}
}

func TestLatency(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	mustEcho(t, c, r, "warm")
	p.SetLatency(50 * time.Millisecond)
	start := time.Now()
	mustEcho(t, c, r, "slow")
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("round trip with 50ms latency each way took %v, want >= 100ms", d)
	}
	p.SetLatency(0)
	start = time.Now()
	mustEcho(t, c, r, "fast")
	if d := time.Since(start); d >= 100*time.Millisecond {
		t.Fatalf("round trip after removing latency took %v", d)
	}
}

func TestRefuse(t *testing.T) {
	e := newEcho(t)
	p := newProxy(t, e.ln.Addr().String())
	c, r := dial(t, p)
	// The proxy accepts c in its own goroutine: one round trip makes sure
	// it did before refusing starts.
	mustEcho(t, c, r, "established")
	p.Refuse(true)
	if err := refused(p); err != nil {
		t.Fatalf("new connection while refusing: %v, want it reset", err)
	}
	mustEcho(t, c, r, "old connections keep working")
	p.Refuse(false)
	c3, r3 := dial(t, p)
	mustEcho(t, c3, r3, "y")
}

// An unreachable target closes the client's connection.
func TestUnreachableTarget(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	p := newProxy(t, addr)
	if err := refused(p); err != nil {
		t.Fatalf("through a proxy to a closed port: %v, want the connection to end", err)
	}
}

func TestBadInputAndClose(t *testing.T) {
	if _, err := New(""); err == nil {
		t.Fatal("New with an empty target succeeded")
	}
	if _, err := New("no-port"); err == nil {
		t.Fatal("New with a target without a port succeeded")
	}
	if _, err := Listen("127.0.0.1:-1", "127.0.0.1:1"); err == nil {
		t.Fatal("Listen on a bad address succeeded")
	}
	e := newEcho(t)
	p, err := New(e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, r := dial(t, p)
	mustEcho(t, c, r, "x")
	p.Blackhole() // Close must not hang on a blackholed link
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("the proxy still accepts after Close")
	}
}
