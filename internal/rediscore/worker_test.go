package rediscore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/redistest"
)

// Calls on a context that can be cancelled run on workers: one caller's
// calls, one after another, all run on one worker; concurrent callers
// start no more workers than there are callers; Close ends them all.
func TestNodeWorkers(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pair := func(key, owner string) error {
		if _, err := n.Acquire(ctx, key, owner, time.Minute); err != nil {
			return err
		}
		return n.Release(ctx, key, owner)
	}
	for range 50 {
		if err := pair("k", "o"); err != nil {
			t.Fatal(err)
		}
	}
	if w := n.workers.Load(); w != 1 {
		t.Fatalf("50 calls one after another ran on %d workers, want 1", w)
	}
	const callers = 8
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for i := range callers {
		wg.Go(func() {
			for range 20 {
				if err := pair("k"+itoa(int64(i)), "o"); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if w := n.workers.Load(); w < 1 || w > callers {
		t.Fatalf("%d concurrent callers ran on %d workers", callers, w)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return n.workers.Load() == 0 })
}

// A caller whose context ends while its call is stuck on a frozen server
// returns at once; the worker finishes the call once the server is back,
// and is then used again.
func TestNodeWorkerOutlivesCaller(t *testing.T) {
	s := redistest.Start(t)
	n := NewNode(newTestConn(t, s.Addr), Options{})
	defer n.Close()
	if err := n.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- n.Ping(ctx) }()
	waitUntil(t, func() bool { return n.workers.Load() == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ping cut short = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ping did not return when its context was cancelled")
	}
	s.Cont()
	waitUntil(t, func() bool { return n.idle.Load() == 1 })
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	if err := n.Ping(ctx2); err != nil {
		t.Fatal(err)
	}
	if w := n.workers.Load(); w != 1 {
		t.Fatalf("%d workers after the server came back, want the one", w)
	}
}
