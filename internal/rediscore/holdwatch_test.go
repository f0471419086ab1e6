package rediscore

import (
	"context"
	"errors"
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

// Two grants watched on one key: a read that shows one of them reports
// only the other lost; stopping a watch cuts short the read under way
// only when it was the key's last.
func TestHoldWatchEntriesOfOneKey(t *testing.T) {
	var mu sync.Mutex
	value := "1:a"
	started := make(chan context.Context, 16)
	block := false
	h := NewHoldWatch(func(ctx context.Context, _ string) (string, bool, error) {
		mu.Lock()
		v, b := value, block
		mu.Unlock()
		if b {
			started <- ctx
			<-ctx.Done()
			return "", false, ctx.Err()
		}
		return v, true, nil
	}, "p")
	defer h.Close()
	lost := make(chan string, 4)
	report := func(who string) func(error) { return func(error) { lost <- who } }
	stopA, err := h.Watch("k", "a", 1, report("a"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopA()
	stopB, err := h.Watch("k", "b", 2, report("b"))
	if err != nil {
		t.Fatal(err)
	}
	defer stopB()
	select {
	case who := <-lost:
		if who != "b" {
			t.Fatalf("the read showed a's grant, and %s was reported lost", who)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("b's grant, absent from the read, was not reported lost")
	}
	// a alone is watched now; its next read blocks.
	mu.Lock()
	block = true
	mu.Unlock()
	stopC, err := h.Watch("k", "c", 3, report("c"))
	if err != nil {
		t.Fatal(err)
	}
	var rctx context.Context
	select {
	case rctx = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("no read after a new watch")
	}
	stopC()
	select {
	case <-rctx.Done():
		t.Fatal("a read was cut short while a's watch goes on")
	case <-time.After(50 * time.Millisecond): // it must stay open: nothing to wait for
	}
	stopA()
	select {
	case <-rctx.Done():
		if !errors.Is(rctx.Err(), context.Canceled) {
			t.Fatalf("read's context ended with %v, want Canceled", rctx.Err())
		}
	case <-time.After(time.Second):
		t.Fatal("the key's last watch stopped, and its read went on")
	}
	select {
	case who := <-lost:
		t.Fatalf("%s reported lost", who)
	default:
	}
}

// Releasing silences the owner's watches of the key only: a release that
// succeeds ends them without a report, one that fails resumes them, and a
// watch of another owner on the same key goes on reporting.
func TestHoldWatchReleasing(t *testing.T) {
	var mu sync.Mutex
	values := map[string]string{}
	reads := 0
	h := NewHoldWatch(func(_ context.Context, lock string) (string, bool, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		v, ok := values[lock]
		return v, ok, nil
	}, "p")
	defer h.Close()
	set := func(key, v string) string {
		lock := LockKey("p", key)
		mu.Lock()
		defer mu.Unlock()
		if v == "" {
			delete(values, lock)
		} else {
			values[lock] = v
		}
		return lock
	}
	readsNow := func() int { mu.Lock(); defer mu.Unlock(); return reads }
	lost := make(chan string, 8)
	watch := func(key, owner string, token uint64) {
		t.Helper()
		n := readsNow()
		stop, err := h.Watch(key, owner, token, func(error) { lost <- key + "/" + owner })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		waitUntil(t, func() bool { return readsNow() > n })
	}
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-lost:
			if got != want {
				t.Fatalf("%s reported lost, want %s", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s not reported lost", want)
		}
	}

	// A release that fails: the watch resumes, and finds the key gone.
	set("k1", "1:a")
	watch("k1", "a", 1)
	r := h.Releasing("k1", "a")
	h.Invalidate(set("k1", ""))
	r.Done(errors.New("timeout"))
	expect("k1/a")

	// A release that succeeds: the watch ends without a report. A's
	// release leaves b's watch of the same key on, and b's loss is
	// reported alone.
	set("k2", "2:a")
	watch("k2", "a", 2)
	r = h.Releasing("k2", "b") // b watches nothing yet: a no-op
	r.Done(nil)
	r = h.Releasing("k2", "a")
	watch("k2", "b", 3) // the read shows a's grant: b is lost
	expect("k2/b")
	h.Invalidate(set("k2", ""))
	r.Done(nil)
	h.mu.Lock()
	_, watched := h.keys[LockKey("p", "k2")]
	h.mu.Unlock()
	if watched {
		t.Fatal("k2 still watched after its owner's release")
	}
	set("k3", "4:a")
	watch("k3", "a", 4)
	select {
	case who := <-lost:
		t.Fatalf("%s reported lost", who)
	default:
	}
}
