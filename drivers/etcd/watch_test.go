package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func mustWake(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("no wake-up: %s", what)
	}
}

// Waiters in different processes queue: a release wakes only the first,
// and the next is woken when the first leaves the queue.
func TestWaitQueueWakesInOrder(t *testing.T) {
	holder := openTest(t, "")
	url := testURL(t) + holder.Prefix()
	ctx := testCtx(t)
	var ws []*Locker
	for range 3 {
		d, err := Driver{}.Open(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		ws = append(ws, d.(*Locker))
	}
	if _, err := holder.Acquire(ctx, "k", "h", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var wakes []<-chan struct{}
	var cancels []func()
	for _, w := range ws {
		wake, cancel, err := w.Subscribe(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		wakes, cancels = append(wakes, wake), append(cancels, cancel)
	}
	r, err := holder.Client().Get(ctx, holder.WaitPrefix("k"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 3 {
		t.Fatalf("queue has %d entries (%v), want 3", r.Count, err)
	}
	owner := "h"
	cur := driver.Locker(holder)
	for i, w := range ws {
		if err := cur.Release(ctx, "k", owner); err != nil {
			t.Fatal(err)
		}
		mustWake(t, wakes[i], "first waiter after a release")
		for j := i + 1; j < len(ws); j++ {
			if woken(wakes[j]) {
				t.Fatalf("waiter %d woken by a release while waiter %d is first", j, i)
			}
		}
		owner = "w" + string(rune('0'+i))
		if _, err := w.Acquire(ctx, "k", owner, 5*time.Second); err != nil {
			t.Fatalf("woken waiter %d: %v", i, err)
		}
		cancels[i]() // leaves the queue: the next waiter now watches the lock
		cur = w
	}
	if err := cur.Release(ctx, "k", owner); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 10*time.Second, "the queue to empty", func() bool {
		r, err := holder.Client().Get(ctx, holder.WaitPrefix("k"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && r.Count == 0
	})
}

// A subscriber first in the queue on a free key is woken at once; a wait
// survives the loss of its session lease (its queue entry).
func TestWaitSessionLoss(t *testing.T) {
	h := openTest(t, "")
	d, err := Driver{}.Open(testURL(t) + h.Prefix())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	w := d.(*Locker)
	ctx := testCtx(t)

	wake, cancel, err := w.Subscribe(ctx, "free")
	if err != nil {
		t.Fatal(err)
	}
	mustWake(t, wake, "subscription to a free key")
	cancel()
	cancel() // idempotent

	if _, err := h.Acquire(ctx, "k", "h", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	w2, err := New(context.Background(), w.Client(), &Options{Prefix: h.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	wake1, cancel1, err := w.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel1()
	wake2, cancel2, err := w2.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	// w2's queue entry vanishes behind its back.
	w2.sessMu.Lock()
	sess := w2.sess
	w2.sessMu.Unlock()
	if _, err := w2.Client().Revoke(ctx, sess); err != nil {
		t.Fatal(err)
	}
	cancel1() // w leaves: w2 looks again, finds its entry gone, queues anew, is first
	if err := h.Release(ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	mustWake(t, wake2, "re-queued waiter after a release")
	_ = wake1
}

func TestSubscribeContext(t *testing.T) {
	l := openTest(t, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := l.Subscribe(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe with a cancelled context: %v", err)
	}
	r, err := l.Client().Get(testCtx(t), l.WaitPrefix("k"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("cancelled Subscribe left %d queue entries (%v)", r.Count, err)
	}
}
