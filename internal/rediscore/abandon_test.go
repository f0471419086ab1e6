package rediscore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// proxied starts a fault proxy to addr, closed at the end of the test.
func proxied(t *testing.T, addr string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// abandonedAcquire calls acquire with a ctx that ends while the call is on
// the wire (the proxy delays each direction by 100ms) and checks that it
// returned promptly with the ctx's error.
func abandonedAcquire(t *testing.T, acquire func(ctx context.Context) (uint64, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := acquire(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire with a ctx ending mid-call = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Fatalf("acquire returned %v after its ctx ended at 30ms", d)
	}
}

func waitFor[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned acquire's clean-up did not finish within 10s")
	}
	panic("unreachable")
}

// A second Node calling Acquire with the owner of a live lock (a WithOwner
// hand-over) whose ctx ends mid-call must leave that lock held, with its
// token; a grant such an attempt created on a free key is deleted.
func TestNodeAbandonedAcquireKeepsPriorLock(t *testing.T) {
	s := redistest.Start(t)
	a := NewNode(newTestConn(t, s.Addr), Options{})
	p := proxied(t, s.Addr)
	b := NewNode(newTestConn(t, p.Addr()), Options{})
	done := make(chan grant, 1)
	b.abandoned = func(g grant) { done <- g }
	ctx := context.Background()
	if err := b.Ping(ctx); err != nil { // connect before the latency
		t.Fatal(err)
	}
	tok, err := a.Acquire(ctx, "k", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p.SetLatency(100 * time.Millisecond)

	abandonedAcquire(t, func(ctx context.Context) (uint64, error) { return b.Acquire(ctx, "k", "o", time.Minute) })
	if g := waitFor(t, done); g.kind != grantExisting || g.token != tok {
		t.Fatalf("abandoned re-acquire outcome = %+v, want existing grant %d", g, tok)
	}
	if info, err := a.Inspect(ctx, "k"); err != nil || info.Owner != "o" || info.Token != tok {
		t.Fatalf("after the abandoned re-acquire: inspect = %+v, %v; want o holding token %d", info, err, tok)
	}

	abandonedAcquire(t, func(ctx context.Context) (uint64, error) { return b.Acquire(ctx, "free", "o", time.Minute) })
	if g := waitFor(t, done); g.kind != grantCreated {
		t.Fatalf("abandoned acquire of a free key: outcome %+v, want a created grant", g)
	}
	if info, err := a.Inspect(ctx, "free"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("the grant an abandoned acquire created was left: %+v, %v", info, err)
	}
}

// The same for Redlock, with the ctx ending in the gate's round and in the
// round of the other nodes.
func TestRedlockAbandonedAcquireKeepsPriorLock(t *testing.T) {
	ss := redistest.StartN(t, 3)
	direct := make([]Conn, len(ss))
	viaProxy := make([]Conn, len(ss))
	proxies := make([]*faultproxy.Proxy, len(ss))
	for i, s := range ss {
		direct[i] = newTestConn(t, s.Addr)
		proxies[i] = proxied(t, s.Addr)
		viaProxy[i] = newTestConn(t, proxies[i].Addr())
	}
	o := Options{NodeTimeout: 2 * time.Second}
	a := NewRedlock(direct, o)
	b := NewRedlock(viaProxy, o)
	done := make(chan []grant, 1)
	b.abandoned = func(g []grant) { done <- g }
	ctx := context.Background()
	if err := b.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	for _, round := range []string{"gate", "others"} {
		t.Run(round, func(t *testing.T) {
			held, free := "held-"+round, "free-"+round
			for i, p := range proxies {
				// The ctx ends in the gate's round, or in the next one
				// when the gate answers at once.
				if round == "gate" || (i != b.gate(held) && i != b.gate(free)) {
					p.SetLatency(100 * time.Millisecond)
				} else {
					p.SetLatency(0)
				}
			}
			tok, err := a.Acquire(ctx, held, "o", time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			abandonedAcquire(t, func(ctx context.Context) (uint64, error) { return b.Acquire(ctx, held, "o", time.Minute) })
			for i, g := range waitFor(t, done) {
				if g.kind != grantExisting && g.kind != grantUnknown {
					t.Fatalf("node %d: abandoned re-acquire outcome %+v, want existing (or not asked)", i, g)
				}
			}
			for i, c := range direct {
				info, err := NewNode(c, Options{}).Inspect(ctx, held)
				if err != nil || info.Owner != "o" || info.Token != tok {
					t.Fatalf("node %d after the abandoned re-acquire: %+v, %v; want o holding token %d", i, info, err, tok)
				}
			}
			if info, err := a.Inspect(ctx, held); err != nil || info.Token != tok {
				t.Fatalf("redlock inspect = %+v, %v", info, err)
			}

			abandonedAcquire(t, func(ctx context.Context) (uint64, error) { return b.Acquire(ctx, free, "o", time.Minute) })
			created := 0
			for _, g := range waitFor(t, done) {
				if g.kind == grantCreated {
					created++
				}
			}
			if want := map[string]int{"gate": 1, "others": 3}[round]; created != want {
				t.Fatalf("abandoned acquire of a free key created %d grants, want %d", created, want)
			}
			for i, c := range direct {
				if info, err := NewNode(c, Options{}).Inspect(ctx, free); !errors.Is(err, driver.ErrNotHeld) {
					t.Fatalf("node %d: the grant an abandoned acquire created was left: %+v, %v", i, info, err)
				}
			}
		})
	}
}
