package rediscore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

func TestNodeBasics(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx := context.Background()
	owner := "owner:with:colons"
	tok, err := n.Acquire(ctx, "k", owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Idempotent: same token.
	if tok2, err := n.Acquire(ctx, "k", owner, time.Minute); err != nil || tok2 != tok {
		t.Fatalf("re-acquire = %d, %v; want %d", tok2, err, tok)
	}
	// Another owner: HeldError with the remaining TTL.
	_, err = n.Acquire(ctx, "k", "other", time.Minute)
	var he *driver.HeldError
	if !errors.As(err, &he) || !errors.Is(err, driver.ErrNotAcquired) || he.Remaining <= 50*time.Second {
		t.Fatalf("acquire by other = %v; want HeldError with ~1m remaining", err)
	}
	// A suffix of the owner is not the owner.
	if err := n.Release(ctx, "k", "colons"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by suffix = %v", err)
	}
	if err := n.Refresh(ctx, "k", "with:colons", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh by suffix = %v", err)
	}
	info, err := n.Inspect(ctx, "k")
	if err != nil || info.Owner != owner || info.Token != tok || info.Remaining <= 50*time.Second {
		t.Fatalf("inspect = %+v, %v", info, err)
	}
	if err := n.Refresh(ctx, "k", owner, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(ctx, "k", owner); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(ctx, "k", owner); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("second release = %v", err)
	}
	if _, err := n.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("inspect free = %v", err)
	}
	tok3, err := n.Acquire(ctx, "k", "other", time.Minute)
	if err != nil || tok3 <= tok {
		t.Fatalf("token after release = %d, %v; want > %d", tok3, err, tok)
	}
}

func TestNodeRefreshDoesNotRevive(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx := context.Background()
	if _, err := n.Acquire(ctx, "k", "o", 20*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := n.Inspect(ctx, "k"); errors.Is(err, driver.ErrNotHeld) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("lock did not expire")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	if err := n.Refresh(ctx, "k", "o", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh of expired lock = %v", err)
	}
	if v, _ := s.Do("EXISTS", "locker:{k}"); v != int64(0) {
		t.Fatal("refresh revived the key")
	}
}

func TestNodeTokensIncrease(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx := context.Background()
	var last uint64
	next := func(what string) {
		t.Helper()
		tok, err := n.Acquire(ctx, "k", "o", time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if tok <= last {
			t.Fatalf("%s: token %d not > %d", what, tok, last)
		}
		last = tok
		if err := n.Release(ctx, "k", "o"); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ {
		next("release/re-acquire")
	}
	// Counter far ahead of the clock: counter+1 wins.
	future := time.Now().Add(time.Hour).UnixMicro()
	if _, err := s.Do("SET", "locker:{k}:token", itoa(future)); err != nil {
		t.Fatal(err)
	}
	next("counter ahead")
	if last != uint64(future)+1 {
		t.Fatalf("token %d, want counter+1 = %d", last, future+1)
	}
	// Counter lost: the TIME floor keeps tokens increasing (clock ok).
	if _, err := s.Do("DEL", "locker:{k}:token"); err != nil {
		t.Fatal(err)
	}
	last = uint64(time.Now().Add(-time.Second).UnixMicro())
	next("counter deleted")
	// Server restarted empty.
	s.Restart()
	next("after restart")
}

func TestNodeCounterExpires(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{TokenRetention: time.Second})
	ctx := context.Background()
	if _, err := n.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	v, err := s.Do("PTTL", "locker:{k}:token")
	if err != nil || v.(int64) <= 60_000 || v.(int64) > 61_000 {
		t.Fatalf("counter PTTL = %v, %v; want ttl + retention (61s)", v, err)
	}
}

func TestNodeBadInput(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{MaxKeyLen: 8})
	ctx := context.Background()
	for name, err := range map[string]error{
		"empty key":    func() error { _, err := n.Acquire(ctx, "", "o", time.Second); return err }(),
		"long key":     func() error { _, err := n.Acquire(ctx, "123456789", "o", time.Second); return err }(),
		"empty owner":  func() error { _, err := n.Acquire(ctx, "k", "", time.Second); return err }(),
		"zero ttl":     func() error { _, err := n.Acquire(ctx, "k", "o", 0); return err }(),
		"negative ttl": n.Refresh(ctx, "k", "o", -time.Second),
		"release long": n.Release(ctx, "123456789", "o"),
	} {
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if v, _ := s.Do("DBSIZE"); v != int64(0) {
		t.Fatalf("bad input left %v keys", v)
	}
}

func TestNodeContext(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := n.Acquire(ctx, "k", "o", time.Second); !errors.Is(err, context.Canceled) {
		t.Fatalf("acquire with done ctx = %v", err)
	}
	// A frozen server: the call returns at the deadline, and nothing is
	// left behind once the server resumes.
	s.Stop()
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	start := time.Now()
	_, err := n.Acquire(dctx, "k", "o", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire on frozen server = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("acquire took %v after its deadline", d)
	}
	s.Cont()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, _ := s.Do("EXISTS", "locker:{k}")
		if v == int64(0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a cancelled acquire left the lock behind")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

func TestNodeClose(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Acquire(context.Background(), "k", "o", time.Second); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("acquire after close = %v", err)
	}
	if err := n.Ping(context.Background()); !errors.Is(err, driver.ErrClosed) || strings.HasPrefix(err.Error(), "locker:") {
		t.Fatalf("ping after close = %v", err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
