package redistest

import "testing"

func TestStartTLS(t *testing.T) {
	s := StartTLS(t)
	if v, err := s.Do("PING"); err != nil || v != "PONG" {
		t.Fatalf("PING over TLS = %v, %v", v, err)
	}
	if _, err := Do(s.Addr, "PING"); err == nil {
		t.Fatal("plain-text PING to a TLS port succeeded")
	}
	if len(s.CACert) == 0 {
		t.Fatal("no CACert")
	}
}
