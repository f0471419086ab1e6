package rediscore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// While one batch of re-reads is on the wire, the re-reads that fall due
// go out together as the next batch; each key gets its own result (one
// key found overwritten is reported lost, the others are not).
func TestHoldWatchCoalescesReads(t *testing.T) {
	first := make(chan struct{})
	var mu sync.Mutex
	var batches [][]string
	values := map[string]string{}
	h := NewHoldWatch(func(context.Context, string) (string, bool, error) {
		return "", false, errors.New("the batch reader must be used")
	}, "p")
	h.SetBatchReader(func(ctx context.Context, locks []string) []HoldRead {
		mu.Lock()
		batches = append(batches, slices.Clone(locks))
		n := len(batches)
		mu.Unlock()
		if n == 1 {
			<-first // hold the first batch on the wire
		}
		out := make([]HoldRead, len(locks))
		mu.Lock()
		for i, l := range locks {
			v, ok := values[l]
			out[i] = HoldRead{Value: v, Exists: ok}
		}
		mu.Unlock()
		return out
	})
	defer h.Close()
	lost := make(chan string, 8)
	watch := func(key string, token uint64) {
		lock, _, _ := Keys("p", key)
		mu.Lock()
		values[lock] = "1:o"
		mu.Unlock()
		if _, err := h.Watch(key, "o", token, func(err error) {
			if !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("lost(%v): want ErrNotHeld", err)
			}
			lost <- key
		}); err != nil {
			t.Fatal(err)
		}
	}
	watch("a", 1) // its first read is the held batch
	waitUntil(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 })
	for _, k := range []string{"b", "c", "d"} {
		watch(k, 1)
	}
	lockD, _, _ := Keys("p", "d")
	mu.Lock()
	values[lockD] = "2:someone-else"
	mu.Unlock()
	// b, c and d are queued behind the held batch: let it go.
	waitUntil(t, func() bool { h.batch.mu.Lock(); defer h.batch.mu.Unlock(); return len(h.batch.pending) == 3 })
	close(first)
	select {
	case k := <-lost:
		if k != "d" {
			t.Fatalf("lost %q, want d", k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the overwritten key was not reported")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 2 || len(batches[1]) != 3 {
		t.Fatalf("batches %v: want the first key alone, then the other three together", batches)
	}
	select {
	case k := <-lost:
		t.Fatalf("%q reported lost too", k)
	default:
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	for until := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(until) {
			t.Fatal("condition not reached within 10s")
		}
	}
}
