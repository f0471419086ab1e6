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
	changes := make(chan struct{}, 8)
	stop, err := h.WatchChanges("k", func() { changes <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	lock, _, _ := Keys("p", "k")
	expect := func(what string) {
		t.Helper()
		select {
		case <-changes:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: not reported", what)
		}
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
	h.Invalidate(lock)
	waitUntil(t, func() bool { return readsNow() > n })
	select {
	case <-changes:
		t.Fatal("a refresh (same value after an invalidation) was reported")
	case <-time.After(50 * time.Millisecond): // a "never" check: a report would follow its read at once
	}
	// The release: absent after present.
	mu.Lock()
	value, exists = "", false
	mu.Unlock()
	h.Invalidate(lock)
	expect("a release")
}
