package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/opaquetest"
	"github.com/go-locker/locker/internal/sharedtest"
)

var srq = sharedtest.Req

// sharedHelper runs in a helper process (see helperMain): "permit" takes a
// permit of a semaphore of 2 on key arg through package locker, renewed,
// says "permit" and waits to be killed; "waitwrite" waits for the write
// lock of key arg, "waitpermit" for a permit of a semaphore of 1 on it,
// until killed.
func sharedHelper(l *Locker, mode, key string) int {
	ctx := context.Background()
	switch mode {
	case "permit":
		lk, err := locker.New(l).Semaphore(key, 2).Acquire(ctx, locker.WithTTL(200*time.Millisecond), locker.WithOwner("child"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("permit")
		<-lk.Lost()
		fmt.Fprintln(os.Stderr, "lost:", lk.Err())
		return 1
	case "waitpermit":
		_, err := l.AcquireShared(ctx, key, srq(driver.SharedPermit, "child", time.Minute, 1, true))
		fmt.Fprintln(os.Stderr, "granted:", err)
		return 1
	case "waitwrite":
		_, err := l.AcquireShared(ctx, key, srq(driver.SharedWrite, "child", time.Minute, 0, true))
		fmt.Fprintln(os.Stderr, "granted:", err)
		return 1
	}
	return 2
}

// record reads the shared record of key's semaphore (rw false) or
// read-write lock.
func record(t *testing.T, l *Locker, key string, rw bool) sharedRec {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(l.Dir(), sharedFileName(key, rw)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	r, err := decodeShared(b)
	if err != nil {
		t.Fatalf("%v: %q", err, b)
	}
	return r
}

// waitQueued waits until the lock has n queued requests.
func waitQueued(t *testing.T, l *Locker, key string, rw bool, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(record(t, l, key, rw).queue) != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", len(record(t, l, key, rw).queue), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A permit holder in another process, renewing, is killed with SIGKILL:
// its permit comes back to a waiter within 100ms after its lease ends, not
// before, and the other holder keeps its permit.
func TestSharedCrash(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	const key, ttl = "uploads", 200 * time.Millisecond
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedPermit, "parent", time.Minute, 2, false)); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, dir, "permit", key)
	h.expect(t, "permit")
	granted := make(chan time.Time, 1)
	go func() {
		if _, err := b.AcquireShared(ctx, key, srq(driver.SharedPermit, "next", time.Minute, 2, true)); err != nil {
			t.Error(err)
		}
		granted <- time.Now()
	}()
	waitQueued(t, a, key, false, 1)
	// The child renews: its permit outlives its TTL.
	time.Sleep(2 * ttl)
	select {
	case <-granted:
		t.Fatal("the waiter was granted while the child renews its permit")
	default:
	}
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	sharedtest.CrashReturned(t, a, key, granted)
}

// A waiting writer whose process is killed blocks readers no more: its
// entry is dropped at the next settle, made by the reader queued behind
// it as soon as the dead process's waiter file is closed, within 500ms
// when nothing else happens, and its waiter file is removed.
func TestSharedDeadWaiter(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir)
	ctx := ctxT(t)
	const key = "catalog"
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r0", time.Minute, 0, false)); err != nil {
		t.Fatal(err)
	}
	h := startHelper(t, dir, "waitwrite", key)
	waitQueued(t, a, key, true, 1)
	_, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r1", time.Minute, 0, false))
	if !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("a read behind the waiting writer: %v, want ErrNotAcquired", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := open(t, dir).AcquireShared(ctx, key, srq(driver.SharedRead, "r2", time.Minute, 0, true))
		got <- err
	}()
	waitQueued(t, a, key, true, 2)
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	killed := time.Now()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the reader behind the dead writer was granted %v after the kill", time.Since(killed))
	case <-time.After(500 * time.Millisecond):
		t.Fatal("the reader behind the dead writer was not granted within 500ms")
	}
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r1", time.Minute, 0, false)); err != nil {
		t.Fatalf("a read after the waiting writer died: %v", err)
	}
	if r := record(t, a, key, true); len(r.queue) != 0 || len(r.holders) != 3 {
		t.Fatalf("record after: %+v, want the three readers and no waiter", r)
	}
	for _, name := range entries(t, dir) {
		if strings.HasSuffix(name, ".wait") {
			t.Fatalf("the dead waiter's file %s is left", name)
		}
	}
}

// Writer preference under load: 8 readers in their own Lockers take and
// release read holds in a loop; a writer that starts waiting is granted
// once the reads in force at its arrival end (each is held 2ms), within
// a second, and holds alone.
func TestSharedWriterStarvation(t *testing.T) {
	dir := t.TempDir()
	sharedtest.WriterStarvation(t, func() driver.SharedLocker { return open(t, dir) }, time.Second)
}

// Keys and owners are opaque for shared holds too: for every name of
// opaquetest.Names, a permit and a write hold are listed with the exact
// owner, handed to a waiter in another Locker on release, and no two keys,
// nor a key's semaphore and read-write lock, interfere.
func TestSharedOpaqueKeys(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	sharedtest.Opaque(t, a, b, func(key string, mode driver.SharedMode) { waitQueued(t, a, key, mode.RW(), 1) })
	if n := len(entries(t, dir)); n != 2*len(opaquetest.Names) {
		t.Errorf("%d files for %d keys' semaphores and read-write locks, want %d", n, len(opaquetest.Names), 2*len(opaquetest.Names))
	}
}

// Waiters for a permit in separate Lockers are granted one per release,
// in arrival order, and leave no waiter file and no open descriptor.
func TestSharedFIFO(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir)
	ctx := ctxT(t)
	if _, err := a.AcquireShared(ctx, "k", srq(driver.SharedPermit, "h", time.Minute, 1, false)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		i   int
		err error
	}
	out := make(chan result, 4)
	for i := range 4 {
		l := open(t, dir)
		go func() {
			_, err := l.AcquireShared(ctx, "k", srq(driver.SharedPermit, fmt.Sprint(i), time.Minute, 1, true))
			out <- result{i, err}
		}()
		waitQueued(t, a, "k", false, i+1)
	}
	holder := "h"
	for i := range 4 {
		if err := a.ReleaseShared(ctx, "k", driver.SharedPermit, holder); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-out:
			if r.err != nil || r.i != i {
				t.Fatalf("release %d granted waiter %d (%v), want %d", i, r.i, r.err, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no waiter granted")
		}
		holder = fmt.Sprint(i)
	}
	for _, name := range entries(t, dir) {
		if strings.HasSuffix(name, ".wait") {
			t.Errorf("waiter file %s left", name)
		}
	}
	if n := openCount(t, filepath.Join(dir, sharedFileName("k", false))); n != 0 {
		t.Errorf("%d descriptors of the semaphore's file left open", n)
	}
}

// The record format: holders and waiters with any bytes in their owners
// survive a round trip, and bytes past the counted lines (a writer killed
// before its truncate) are ignored.
func TestSharedRecord(t *testing.T) {
	r := sharedRec{boot: "b", floor: 9, key: " k\n\x00\xff",
		holders: []sharedHolder{{token: 7, mode: driver.SharedRead, expires: 5, owner: "a b\n"}, {token: 9, mode: driver.SharedRead, expires: -1, via: "ab12", owner: ""}},
		queue:   []sharedEntry{{id: "cd34", mode: driver.SharedWrite, limit: 0, ttl: time.Second, owner: "\"w\""}},
	}
	b := r.encode(nil)
	b = append(b, "h 1 w 2 - \"stale\"\n"...)
	got, err := decodeShared(b)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(r) {
		t.Fatalf("decoded %+v, want %+v", got, r)
	}
	for _, bad := range []string{"s1 b 1 1 0 \"k\"\n", "s2 b 1 0 0 \"k\"\n", "s1 b 1 0 0 k\n", "s1 b 1 0 1 \"k\"\nq x z 1 1 \"o\"\n"} {
		if _, err := decodeShared([]byte(bad)); err == nil {
			t.Errorf("decoded %q", bad)
		}
	}
}

// Without inotify a waiter re-reads the lock's file every pollInterval: a
// release still reaches it within a few polls.
func TestSharedPollingFallback(t *testing.T) {
	noInotify = true
	t.Cleanup(func() { noInotify = false })
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	if _, err := a.AcquireShared(ctx, "k", srq(driver.SharedWrite, "w", time.Hour, 0, false)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := b.AcquireShared(ctx, "k", srq(driver.SharedRead, "r", time.Hour, 0, true))
		got <- err
	}()
	waitQueued(t, a, "k", true, 1)
	if err := a.ReleaseShared(ctx, "k", driver.SharedWrite, "w"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * pollInterval):
		t.Fatalf("the polling waiter was not granted within %v of the release", 10*pollInterval)
	}
}
