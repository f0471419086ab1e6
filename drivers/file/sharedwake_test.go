package file

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// waiters starts a waiting request for each of reqs on key, each in a
// Locker of its own, in that order (each queued before the next starts),
// and returns the channel their results arrive on: the owner, or the
// owner and the error.
func waiters(t *testing.T, dir, key string, ctx context.Context, reqs ...driver.SharedRequest) <-chan string {
	t.Helper()
	out := make(chan string, len(reqs))
	a := open(t, dir)
	n := len(record(t, a, key, reqs[0].Mode.RW()).queue)
	for _, req := range reqs {
		l := open(t, dir)
		go func() {
			if _, err := l.AcquireShared(ctx, key, req); err != nil {
				out <- req.Owner + ": " + err.Error()
				return
			}
			out <- req.Owner
		}()
		n++
		waitQueued(t, a, key, req.Mode.RW(), n)
	}
	return out
}

// heldPermit opens a Locker on a new directory in which the owner "h"
// holds the one permit of key's semaphore of 1.
func heldPermit(t *testing.T, key string) (string, *Locker, context.Context) {
	t.Helper()
	dir := t.TempDir()
	a := open(t, dir)
	ctx := ctxT(t)
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedPermit, "h", time.Minute, 1, false)); err != nil {
		t.Fatal(err)
	}
	return dir, a, ctx
}

// permitReq is owner's waiting request for a permit of a semaphore of 1.
func permitReq(owner string) driver.SharedRequest {
	return srq(driver.SharedPermit, owner, time.Minute, 1, true)
}

// granted receives the next result from out, failing t unless it is one
// of want, within 5s.
func granted(t *testing.T, out <-chan string, want ...string) string {
	t.Helper()
	select {
	case got := <-out:
		for _, w := range want {
			if got == w {
				return got
			}
		}
		t.Fatalf("granted %q, want one of %q", got, want)
	case <-time.After(5 * time.Second):
		t.Fatalf("none of %q granted within 5s", want)
	}
	return ""
}

// owners lists the owners of the holders and of the queue of key's
// read-write lock.
func owners(t *testing.T, l *Locker, key string) (holders, queue []string) {
	r := record(t, l, key, true)
	for _, h := range r.holders {
		holders = append(holders, h.owner)
	}
	for _, e := range r.queue {
		queue = append(queue, e.owner)
	}
	return holders, queue
}

// waitFiles returns the names of the waiter files in dir.
func waitFiles(t *testing.T, dir string) []string {
	var out []string
	for _, name := range entries(t, dir) {
		if strings.HasSuffix(name, ".wait") {
			out = append(out, name)
		}
	}
	return out
}

// Read-write waiters are served in arrival order: released by a writer,
// the run of readers at the head is granted, not the reader behind the
// next writer; that writer is granted when both readers have released,
// and the last reader after it.
func TestSharedFIFORW(t *testing.T) {
	dir := t.TempDir()
	a := open(t, dir)
	ctx := ctxT(t)
	const key = "catalog"
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedWrite, "w0", time.Minute, 0, false)); err != nil {
		t.Fatal(err)
	}
	out := waiters(t, dir, key, ctx,
		srq(driver.SharedRead, "r1", time.Minute, 0, true),
		srq(driver.SharedRead, "r2", time.Minute, 0, true),
		srq(driver.SharedWrite, "w3", time.Minute, 0, true),
		srq(driver.SharedRead, "r4", time.Minute, 0, true))
	release := func(mode driver.SharedMode, owner string) {
		t.Helper()
		if err := a.ReleaseShared(ctx, key, mode, owner); err != nil {
			t.Fatal(err)
		}
	}
	release(driver.SharedWrite, "w0")
	first := granted(t, out, "r1", "r2")
	granted(t, out, map[string]string{"r1": "r2", "r2": "r1"}[first])
	if h, q := owners(t, a, key); fmt.Sprint(h, q) != "[r1 r2] [w3 r4]" {
		t.Fatalf("after the writer's release: holders %q, queue %q; want [r1 r2] [w3 r4]", h, q)
	}
	release(driver.SharedRead, "r1")
	if h, q := owners(t, a, key); fmt.Sprint(h, q) != "[r2] [w3 r4]" {
		t.Fatalf("after one reader's release: holders %q, queue %q; want [r2] [w3 r4]", h, q)
	}
	release(driver.SharedRead, "r2")
	granted(t, out, "w3")
	if h, q := owners(t, a, key); fmt.Sprint(h, q) != "[w3] [r4]" {
		t.Fatalf("after the readers' release: holders %q, queue %q; want [w3] [r4]", h, q)
	}
	release(driver.SharedWrite, "w3")
	granted(t, out, "r4")
	if files := waitFiles(t, dir); len(files) != 0 {
		t.Errorf("waiter files left: %q", files)
	}
}

// A release wakes the waiters it grants and the new head of the queue, not
// every waiter: with 4 and with 16 permit waiters queued in their own
// Lockers, each handoff costs the same few flock attempts, all processes
// counted (every waiter re-reading the lock's file on each release would
// cost one per waiter), and so does each enqueue.
func TestSharedReleaseWakesOnlyGranted(t *testing.T) {
	for _, n := range []int{4, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dir, a, ctx := heldPermit(t, "k")
			reqs := make([]driver.SharedRequest, n)
			for i := range reqs {
				reqs[i] = permitReq(fmt.Sprint(i))
			}
			start := flocks.Load()
			out := waiters(t, dir, "k", ctx, reqs...)
			queued := flocks.Load()
			holder := "h"
			for i := range n {
				if err := a.ReleaseShared(ctx, "k", driver.SharedPermit, holder); err != nil {
					t.Fatal(err)
				}
				holder = granted(t, out, fmt.Sprint(i))
			}
			perEnqueue := float64(queued-start) / float64(n)
			perHandoff := float64(flocks.Load()-queued) / float64(n)
			t.Logf("%d waiters: %.2f flock attempts per enqueue, %.2f per handoff", n, perEnqueue, perHandoff)
			if perEnqueue > 6 || perHandoff > 8 {
				t.Fatalf("%.2f flock attempts per enqueue, %.2f per handoff with %d waiters: want at most 6 and 8", perEnqueue, perHandoff, n)
			}
		})
	}
}

// A permit waiter in another process, queued between two waiters, is
// killed with SIGKILL: the waiter behind it is granted next, within 100ms
// of the release that lets it in, and the dead waiter's file is removed.
func TestSharedDeadWaiterMidQueue(t *testing.T) {
	const key = "uploads"
	dir, a, ctx := heldPermit(t, key)
	first := waiters(t, dir, key, ctx, permitReq("first"))
	h := startHelper(t, dir, "waitpermit", key)
	waitQueued(t, a, key, false, 2)
	last := waiters(t, dir, key, ctx, permitReq("last"))
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
	if err := a.ReleaseShared(ctx, key, driver.SharedPermit, "h"); err != nil {
		t.Fatal(err)
	}
	granted(t, first, "first")
	released := time.Now()
	if err := a.ReleaseShared(ctx, key, driver.SharedPermit, "first"); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-last:
		if got != "last" {
			t.Fatal(got)
		}
		t.Logf("the waiter behind the dead one was granted %v after the release", time.Since(released))
	case <-time.After(100 * time.Millisecond):
		t.Fatal("the waiter behind the dead one was not granted within 100ms of the release")
	}
	if files := waitFiles(t, dir); len(files) != 0 {
		t.Errorf("waiter files left: %q", files)
	}
	if r := record(t, a, key, false); len(r.queue) != 0 {
		t.Errorf("queue left: %+v", r.queue)
	}
}

// A waiter whose context ends in the middle of the queue leaves nothing
// behind: its entry and its waiter file are removed at once, and the
// waiter that was behind it is served next.
func TestSharedCancelledWaiterLeavesNothing(t *testing.T) {
	const key = "uploads"
	dir, a, ctx := heldPermit(t, key)
	first := waiters(t, dir, key, ctx, permitReq("first"))
	cctx, cancel := context.WithCancel(ctx)
	mid := waiters(t, dir, key, cctx, permitReq("mid"))
	last := waiters(t, dir, key, ctx, permitReq("last"))
	cancel()
	if got := granted(t, mid, "mid: file: "+context.Canceled.Error()); !strings.HasPrefix(got, "mid:") {
		t.Fatal(got)
	}
	if r := record(t, a, key, false); len(r.queue) != 2 || r.queue[0].owner != "first" || r.queue[1].owner != "last" {
		t.Fatalf("queue after the cancel: %+v, want first and last", r.queue)
	}
	if files := waitFiles(t, dir); len(files) != 2 {
		t.Fatalf("waiter files after the cancel: %q, want the two still waiting", files)
	}
	if err := a.ReleaseShared(ctx, key, driver.SharedPermit, "h"); err != nil {
		t.Fatal(err)
	}
	granted(t, first, "first")
	if err := a.ReleaseShared(ctx, key, driver.SharedPermit, "first"); err != nil {
		t.Fatal(err)
	}
	granted(t, last, "last")
	if files := waitFiles(t, dir); len(files) != 0 {
		t.Errorf("waiter files left: %q", files)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		t.Fatal("the test's own context ended")
	}
}
