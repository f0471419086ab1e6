package rediscore

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/redistest"
)

func TestScriptSHA(t *testing.T) {
	s := redistest.Start(t)
	for _, sc := range []*Script{AcquireScript, RefreshScript, ReleaseScript, InspectScript, FenceScript, QueueAcquireScript, LeaveScript, CleanupScript} {
		v, err := s.Do("SCRIPT", "LOAD", sc.Src)
		if err != nil {
			t.Fatalf("%s: SCRIPT LOAD: %v", sc.Name, err)
		}
		if v != sc.SHA {
			t.Fatalf("%s: SHA %s, server says %v", sc.Name, sc.SHA, v)
		}
	}
}

func TestRunReloadsOnNoscript(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx := context.Background()
	if _, err := n.Acquire(ctx, "k", "o", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(ctx, "k", "o"); err != nil {
		t.Fatalf("release after SCRIPT FLUSH: %v", err)
	}
}

// TestQueueSkipsUnheardWaiter runs QueueAcquireScript on a free lock whose
// queue starts with a live entry: a waiter that joined subscribed
// ("<wid>:<owner>") but whose wake channel nobody listens on any more is
// dropped, and the caller behind it takes the lock; an entry marked "~"
// (not checked) gets the reservation instead, and the caller waits.
func TestQueueSkipsUnheardWaiter(t *testing.T) {
	s := redistest.Start(t)
	lock, counter, _ := Keys("", "skip")
	ql, qz := QueueKeys(lock)
	for _, c := range []struct {
		dead    string
		granted bool
	}{
		{"deadwid:a", true},
		{"~deadwid:a", false},
	} {
		if _, err := s.Do("DEL", lock, ql, qz); err != nil {
			t.Fatal(err)
		}
		me := "mywid:b"
		for _, el := range []string{c.dead, me} {
			if _, err := s.Do("RPUSH", ql, el); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Do("ZADD", qz, "99999999999999", el); err != nil {
				t.Fatal(err)
			}
		}
		v, err := s.Do("EVAL", QueueAcquireScript.Src, "4", lock, counter, ql, qz,
			"b", "10000", "60000", me, "3000", "locker:wake:", "1")
		if err != nil {
			t.Fatal(err)
		}
		_, isToken := v.(string)
		if isToken != c.granted {
			t.Fatalf("head %q: reply %#v; want granted %v", c.dead, v, c.granted)
		}
		held, _ := s.Do("GET", lock)
		rest, _ := s.Do("LRANGE", ql, "0", "-1")
		if c.granted {
			if a, _ := rest.([]any); len(a) != 0 {
				t.Fatalf("head %q: queue left %v, want empty", c.dead, rest)
			}
			continue
		}
		if held != "q:"+c.dead {
			t.Fatalf("head %q: lock %v, want reserved for it", c.dead, held)
		}
		if left, _ := v.(int64); left <= 0 {
			t.Fatalf("head %q: reply %#v, want the reservation's life in ms", c.dead, v)
		}
	}
}
