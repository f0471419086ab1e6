package rediscore

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// The Hub is pure fan-out logic; the adapters' tests exercise it against a
// real server. Here the "server" side is two counters.
type hubLog struct {
	mu          sync.Mutex
	subs, unsub map[string]int
	block       chan struct{}
}

func newHubLog() (*hubLog, *Hub) {
	l := &hubLog{subs: map[string]int{}, unsub: map[string]int{}}
	h := NewHub(func(ctx context.Context, ch string) error {
		l.mu.Lock()
		l.subs[ch]++
		b := l.block
		l.mu.Unlock()
		if b != nil {
			select {
			case <-b:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}, func(ch string) {
		l.mu.Lock()
		l.unsub[ch]++
		l.mu.Unlock()
	})
	return l, h
}

func TestHubSharesOneSubscription(t *testing.T) {
	l, h := newHubLog()
	ctx := context.Background()
	const n = 20
	wakes := make([]chan struct{}, n)
	cancels := make([]func(), n)
	var wg sync.WaitGroup
	for i := range wakes {
		wakes[i] = make(chan struct{}, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := h.Subscribe(ctx, "c", wakes[i])
			if err != nil {
				t.Error(err)
			}
			cancels[i] = c
		}()
	}
	wg.Wait()
	if l.subs["c"] != 1 {
		t.Fatalf("%d server subscriptions, want 1", l.subs["c"])
	}
	h.Wake("c")
	h.Wake("other")
	for i, w := range wakes {
		select {
		case <-w:
		default:
			t.Fatalf("subscriber %d not woken", i)
		}
	}
	for _, c := range cancels {
		c()
		c() // idempotent
	}
	if l.unsub["c"] != 1 || len(h.Channels()) != 0 {
		t.Fatalf("unsubscribed %d times, channels %v", l.unsub["c"], h.Channels())
	}
	// A new subscriber subscribes again.
	c, err := h.Subscribe(ctx, "c", make(chan struct{}, 1))
	if err != nil || l.subs["c"] != 2 {
		t.Fatal(err, l.subs)
	}
	c()
}

func TestHubWaitersShareThePendingSubscribe(t *testing.T) {
	l, h := newHubLog()
	l.block = make(chan struct{})
	ctx := context.Background()
	done := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			_, err := h.Subscribe(ctx, "c", make(chan struct{}, 1))
			done <- err
		}()
	}
	// Wait until the first server subscribe is pending.
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		n := l.subs["c"]
		l.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("subscribe not called")
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
	// A third subscriber gives up while the subscribe is pending.
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := h.Subscribe(cctx, "c", make(chan struct{}, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cancelled subscribe = %v", err)
	}
	close(l.block)
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs["c"] != 1 {
		t.Fatalf("%d server subscriptions, want 1", l.subs["c"])
	}
}

func TestHubClose(t *testing.T) {
	_, h := newHubLog()
	w := make(chan struct{}, 1)
	if _, err := h.Subscribe(context.Background(), "c", w); err != nil {
		t.Fatal(err)
	}
	h.Close()
	select {
	case <-w:
	default:
		t.Fatal("Close did not wake")
	}
	if _, err := h.Subscribe(context.Background(), "c", w); !errors.Is(err, ErrHubClosed) {
		t.Fatal(err)
	}
}

// A done ctx fails Subscribe even when the channel is already subscribed
// (found by conformance Driver/Waiter on Sentinel: a select between the
// ready subscription and the done ctx picked the subscription half the
// time).
func TestHubSubscribeDoneContextOnSubscribedChannel(t *testing.T) {
	_, h := newHubLog()
	defer h.Close()
	wake := make(chan struct{}, 1)
	cancel, err := h.Subscribe(context.Background(), "c", wake)
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	done, stop := context.WithCancel(context.Background())
	stop()
	for i := range 200 {
		c, err := h.Subscribe(done, "c", make(chan struct{}, 1))
		if !errors.Is(err, context.Canceled) {
			if c != nil {
				c()
			}
			t.Fatalf("attempt %d: Subscribe with a cancelled context on a subscribed channel = %v", i, err)
		}
	}
}
