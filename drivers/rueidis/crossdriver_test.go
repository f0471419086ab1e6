package rueidis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	redisdrv "github.com/go-locker/locker/drivers/redis"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// drivers/redis and drivers/rueidis share the key layout and the scripts: a
// lock taken through one blocks the other, tokens keep increasing across
// them, and a release through one wakes the other's waiter.
func TestCrossDriver(t *testing.T) {
	s := redistest.Start(t)
	gr, err := redisdrv.Open(context.Background(), "redis://"+s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer gr.Close()
	ru := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)

	type side struct {
		name string
		d    interface {
			driver.Locker
			driver.Waiter
		}
	}
	sides := []side{{"redis", gr}, {"rueidis", ru}}
	var last uint64
	for round, a := range []int{0, 1, 0, 1} {
		holder, other := sides[a], sides[1-a]
		key := "cross"
		o := newOwner()
		tok, err := holder.d.Acquire(ctx, key, o, 10*time.Second)
		if err != nil {
			t.Fatalf("round %d: %s acquire: %v", round, holder.name, err)
		}
		if tok <= last {
			t.Fatalf("round %d: %s token %d <= previous %d", round, holder.name, tok, last)
		}
		last = tok
		_, err = other.d.Acquire(ctx, key, newOwner(), time.Second)
		var he *driver.HeldError
		if !errors.As(err, &he) || he.Remaining <= 0 {
			t.Fatalf("round %d: %s acquire of a key %s holds: %v, want a HeldError", round, other.name, holder.name, err)
		}
		if err := other.d.Release(ctx, key, newOwner()); !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("round %d: %s release of %s's lock: %v", round, other.name, holder.name, err)
		}
		wake, cancel, err := other.d.Subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		drain(wake)
		if err := holder.d.Release(ctx, key, o); err != nil {
			t.Fatal(err)
		}
		expectWake(t, wake, 10*time.Second, holder.name+" release, seen by "+other.name)
		cancel()
	}

	// Through package locker: a waiter on one driver takes over from a
	// holder on the other.
	lg, lr := locker.New(gr), locker.New(ru)
	lk, err := lg.Acquire(ctx, "cross2", locker.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		l2, err := lr.Acquire(ctx, "cross2", locker.WithTTL(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	select {
	case <-got:
		t.Fatal("rueidis acquired a key held through go-redis")
	case <-time.After(100 * time.Millisecond): // a negative check: nothing may happen
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case l2 := <-got:
		if l2 == nil {
			t.FailNow()
		}
		if l2.Token() <= lk.Token() {
			t.Fatalf("token %d <= previous %d", l2.Token(), lk.Token())
		}
		_ = l2.Release(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("rueidis waiter not woken by a go-redis release")
	}
}

// TestCrossDriverQueue: go-redis and rueidis waiters share one fair queue:
// a go-redis waiter queued behind a rueidis one is granted after it, and
// the other way round.
func TestCrossDriverQueue(t *testing.T) {
	s := redistest.Start(t)
	ru, gr := urlOf(s.Addr), "redis://"+s.Addr
	d := drivertest.Deployment{URL: gr, Servers: []*redistest.Server{s}}
	drivertest.FairOrderAcross(t, d, ru, gr, ru, gr)
}
