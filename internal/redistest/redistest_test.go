package redistest

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestStartKillRestart(t *testing.T) {
	s := Start(t)
	if _, err := s.Do("SET", "k", "v"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Do("GET", "k"); err != nil || v != "v" {
		t.Fatalf("GET = %v, %v", v, err)
	}
	s.Kill()
	if _, err := s.Do("PING"); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart()
	if v, err := s.Do("GET", "k"); err != nil || v != nil {
		t.Fatalf("GET after restart = %v, %v; want nil (empty server)", v, err)
	}
}

func TestStartN(t *testing.T) {
	ms := StartN(t, 3)
	seen := map[string]bool{}
	for _, s := range ms {
		if seen[s.Addr] {
			t.Fatalf("duplicate address %s", s.Addr)
		}
		seen[s.Addr] = true
	}
}

func TestStopCont(t *testing.T) {
	s := Start(t)
	s.Stop()
	s.Cont()
	if v, err := s.Do("PING"); err != nil || v != "PONG" {
		t.Fatalf("PING after Cont = %v, %v", v, err)
	}
}

// A RefusedPort refuses connections, and no listener can take it while the
// test runs.
func TestRefusedPort(t *testing.T) {
	port := RefusedPort(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("dial succeeded")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial = %v, want connection refused", err)
	}
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatal("a listener took the refused port")
	}
	for range 200 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if p == port {
			t.Fatal("the kernel handed out the refused port")
		}
	}
}
