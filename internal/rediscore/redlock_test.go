package rediscore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

func newRedlock(t *testing.T, n int, o Options) (*Redlock, []*redistest.Server) {
	ss := redistest.StartN(t, n)
	conns := make([]Conn, n)
	for i, s := range ss {
		conns[i] = newTestConn(t, s.Addr)
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = 500 * time.Millisecond // loaded CI machines
	}
	return NewRedlock(conns, o), ss
}

func TestRedlockBasics(t *testing.T) {
	r, ss := newRedlock(t, 5, Options{})
	ctx := context.Background()
	tok, err := r.Acquire(ctx, "k", "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Every node stores the written-back token.
	for _, s := range ss {
		v, _ := s.Do("GET", "locker:{k}")
		if v != itoa(int64(tok))+":a" {
			t.Fatalf("%s holds %v, want token %d", s.Addr, v, tok)
		}
	}
	if tok2, err := r.Acquire(ctx, "k", "a", time.Minute); err != nil || tok2 != tok {
		t.Fatalf("re-acquire = %d, %v; want %d", tok2, err, tok)
	}
	_, err = r.Acquire(ctx, "k", "b", time.Minute)
	var he *driver.HeldError
	if !errors.As(err, &he) || he.Remaining < 50*time.Second {
		t.Fatalf("acquire by b = %v, want HeldError ~1m", err)
	}
	info, err := r.Inspect(ctx, "k")
	if err != nil || info.Owner != "a" || info.Token != tok {
		t.Fatalf("inspect = %+v %v", info, err)
	}
	if err := r.Refresh(ctx, "k", "b", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh by b = %v", err)
	}
	if err := r.Refresh(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "k", "b"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by b = %v", err)
	}
	if err := r.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	tok3, err := r.Acquire(ctx, "k", "b", time.Minute)
	if err != nil || tok3 <= tok {
		t.Fatalf("next token %d, %v; want > %d", tok3, err, tok)
	}
}

// Two nodes down out of five: still works. Three down: no grant, a clear error.
func TestRedlockQuorum(t *testing.T) {
	r, ss := newRedlock(t, 5, Options{NodeTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	ss[0].Kill()
	ss[1].Stop() // frozen: times out rather than refusing
	tok, err := r.Acquire(ctx, "k", "a", 10*time.Second)
	if err != nil {
		t.Fatalf("acquire with 2 of 5 down: %v", err)
	}
	if err := r.Refresh(ctx, "k", "a", 10*time.Second); err != nil {
		t.Fatalf("refresh with 2 of 5 down: %v", err)
	}
	if err := r.Release(ctx, "k", "a"); err != nil {
		t.Fatalf("release with 2 of 5 down: %v", err)
	}
	ss[2].Kill()
	_, err = r.Acquire(ctx, "k", "b", 10*time.Second)
	if err == nil || errors.Is(err, driver.ErrNotAcquired) || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("acquire with 3 of 5 down = %v; want a no-quorum error", err)
	}
	t.Log(err)
	// Nothing left held on the live nodes.
	for _, s := range ss[3:] {
		if v, _ := s.Do("EXISTS", "locker:{k}"); v != int64(0) {
			t.Fatalf("%s: failed acquire left the lock", s.Addr)
		}
	}
	// Bring them back (empty): tokens keep increasing (TIME floor).
	ss[1].Cont()
	ss[0].Restart()
	ss[2].Restart()
	tok2, err := r.Acquire(ctx, "k", "b", 10*time.Second)
	if err != nil || tok2 <= tok {
		t.Fatalf("after restart: %d, %v; want > %d", tok2, err, tok)
	}
}

// A refresh that lands on fewer than a quorum fails; once enough nodes
// answer "not held" it is ErrNotHeld.
func TestRedlockRefreshNeedsQuorum(t *testing.T) {
	r, ss := newRedlock(t, 3, Options{NodeTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	if _, err := r.Acquire(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	ss[0].Do("DEL", "locker:{k}")
	if err := r.Refresh(ctx, "k", "a", time.Minute); err != nil {
		t.Fatalf("refresh on 2 of 3: %v", err)
	}
	ss[1].Do("DEL", "locker:{k}")
	if err := r.Refresh(ctx, "k", "a", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh on 1 of 3 = %v, want ErrNotHeld", err)
	}
	ss[1].Kill()
	if err := r.Refresh(ctx, "k", "a", time.Minute); err == nil || errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh with 1 not held, 1 down = %v, want a transient error", err)
	}
}

// A split vote (2 granted, 2 held by x, 1 down): the loser releases its minority grants and gets a jittered
// HeldError.
func TestRedlockSplitVote(t *testing.T) {
	r, all := newRedlock(t, 5, Options{})
	ctx := context.Background()
	// Order the nodes so that the key's gate node is free.
	g := r.gate("k")
	ss := append([]*redistest.Server{}, all[:g]...)
	ss = append(ss, all[g+1:]...)
	ss = append(ss, all[g])
	for _, s := range ss[:2] {
		if _, err := s.Do("SET", "locker:{k}", "1:x", "PX", "60000"); err != nil {
			t.Fatal(err)
		}
	}
	ss[2].Kill()
	_, err := r.Acquire(ctx, "k", "a", time.Minute)
	var he *driver.HeldError
	if !errors.As(err, &he) || he.Remaining <= 0 || he.Remaining > r.Options().NodeTimeout+time.Millisecond {
		t.Fatalf("split vote = %v, want HeldError with a short random delay", err)
	}
	for _, s := range ss[3:] {
		if v, _ := s.Do("EXISTS", "locker:{k}"); v != int64(0) {
			t.Fatalf("%s: minority grant not released", s.Addr)
		}
	}
}

// Concurrent contenders for a fresh key: the gate node makes exactly one win.
func TestRedlockConcurrentExactlyOne(t *testing.T) {
	r, _ := newRedlock(t, 5, Options{})
	for round := 0; round < 5; round++ {
		key := "c" + itoa(int64(round))
		wins := make(chan bool, 16)
		for i := 0; i < 16; i++ {
			go func() {
				_, err := r.Acquire(context.Background(), key, "o"+itoa(int64(i)), time.Minute)
				wins <- err == nil
			}()
		}
		n := 0
		for i := 0; i < 16; i++ {
			if <-wins {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d winners, want 1", round, n)
		}
	}
}

// The gate node down: the others still grant (degraded mode).
func TestRedlockGateDown(t *testing.T) {
	r, ss := newRedlock(t, 5, Options{})
	ss[r.gate("k")].Kill()
	if _, err := r.Acquire(context.Background(), "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
}

func TestRedlockCapabilities(t *testing.T) {
	r := NewRedlock(nil, Options{NodeTimeout: 50 * time.Millisecond})
	if c := r.Capabilities(); c.MinTTL != 150*time.Millisecond || !c.DurableTokens {
		t.Fatalf("%+v", c)
	}
	if r.Quorum() != 1 {
		t.Fatal(r.Quorum())
	}
	// The drift factor reaches the holder's deadline margin: with
	// drift_factor=0.2 the root's safe deadline is the end of the validity
	// window, ttl - (ttl×0.2 + 2ms), not ttl - (ttl/100 + 2ms).
	r = NewRedlock(nil, Options{DriftFactor: 0.2})
	if m := r.Capabilities().Margin(time.Second); m != 202*time.Millisecond {
		t.Fatalf("Margin(1s) with drift_factor=0.2 = %v, want 202ms", m)
	}
}

// A former holder whose lock lingers on a minority of nodes (there it was set
// a moment later, so it expires a moment later) does not hold it: Release
// reports ErrNotHeld rather than success, and still deletes the leftover.
func TestRedlockReleaseNeedsQuorum(t *testing.T) {
	r, ss := newRedlock(t, 3, Options{})
	ctx := context.Background()
	if _, err := r.Acquire(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	// The lock has gone from two of three nodes, as if it expired there.
	for _, s := range ss[:2] {
		if _, err := s.Do("DEL", "locker:{k}"); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Release(ctx, "k", "a"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release held on 1 of 3 nodes = %v, want ErrNotHeld", err)
	}
	if v, _ := ss[2].Do("EXISTS", "locker:{k}"); v != int64(0) {
		t.Fatalf("the minority's leftover was not deleted: EXISTS = %v", v)
	}
	// Held on a quorum (2 of 3): a release succeeds.
	if _, err := r.Acquire(ctx, "k", "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := ss[0].Do("DEL", "locker:{k}"); err != nil {
		t.Fatal(err)
	}
	if err := r.Release(ctx, "k", "b"); err != nil {
		t.Fatalf("release held on 2 of 3 nodes = %v", err)
	}
}
