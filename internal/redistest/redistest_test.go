package redistest

import (
	"testing"
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
