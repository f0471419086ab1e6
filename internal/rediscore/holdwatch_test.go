package rediscore

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A change watch reports a grant and its release made between two of its
// reads: the key is absent at both, but an invalidation came in between.
// An invalidation after which the value is unchanged (a refresh) is not
// reported.
func TestHoldWatchChangeBetweenReads(t *testing.T) {
	var mu sync.Mutex
	value, exists, reads := "", false, 0
	h := NewHoldWatch(func(context.Context, string) (string, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		return value, exists, nil
	}, "p")
	defer h.Close()
	// Each report carries the number of the read it follows: the loop
	// makes no read while changed runs.
	changes := make(chan int, 8)
	stop, err := h.WatchChanges("k", func() {
		mu.Lock()
		defer mu.Unlock()
		changes <- reads
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	lock, _, _ := Keys("p", "k")
	expect := func(what string) int {
		t.Helper()
		select {
		case read := <-changes:
			return read
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported", what)
		}
		return 0
	}
	expect("the first read")
	readsNow := func() int { mu.Lock(); defer mu.Unlock(); return reads }
	// A grant and its release between two reads: absent, then absent.
	n := readsNow()
	h.Invalidate(lock)
	waitUntil(t, func() bool { return readsNow() > n })
	expect("a grant and its release between two reads")
	// A grant seen, then a refresh: the value is unchanged.
	mu.Lock()
	value, exists = "7:o", true
	mu.Unlock()
	h.Invalidate(lock)
	expect("a grant")
	n = readsNow()
	h.Invalidate(lock) // a refresh: the read finds the same value
	waitUntil(t, func() bool { return readsNow() > n })
	refresh := n + 1
	// The release: absent after present. Reports come in read order, so a
	// report of the refresh would come before this one.
	mu.Lock()
	value, exists = "", false
	mu.Unlock()
	h.Invalidate(lock)
	if read := expect("a release"); read == refresh {
		t.Fatal("a refresh (the same value after an invalidation) was reported")
	}
}
