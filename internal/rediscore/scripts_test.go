package rediscore

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/redistest"
)

func TestScriptSHA(t *testing.T) {
	s := redistest.Start(t)
	for _, sc := range []*Script{AcquireScript, RefreshScript, ReleaseScript, InspectScript, FenceScript} {
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
