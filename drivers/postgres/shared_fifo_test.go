package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// In lease mode, waiting permits and readers queue with the writers and
// are granted in arrival order, as far as their mode allows: five waiters
// for a semaphore of 1 are granted one by one in the order they arrived;
// and behind a writer, a reader, a writer and a reader that arrived in that
// order are granted in that order (the first reader is not held back by
// the writer that arrived after it, the second is).
func TestSharedLeaseFIFO(t *testing.T) {
	schema := fmt.Sprintf("shared_fifo_%d", time.Now().UnixNano())
	ctx := ctxFor(t, time.Minute)
	l := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	waitQueued := func(key string, mode driver.SharedMode, n int) {
		t.Helper()
		waitQueuedN(t, ctx, l, schema, mode, key, n)
	}
	// run holds key in first's mode, queues each of waiters in turn, then
	// releases first's hold, and returns the order of the waiters' grants
	// (each releases its hold at once).
	run := func(key string, first driver.SharedRequest, waiters []driver.SharedRequest) []string {
		if _, err := l.AcquireShared(ctx, key, first); err != nil {
			t.Fatal(err)
		}
		order := make(chan string, len(waiters))
		errs := make(chan error, len(waiters))
		for i, r := range waiters {
			go func() {
				_, err := l.AcquireShared(ctx, key, r)
				if err == nil {
					order <- r.Owner
					err = l.ReleaseShared(context.WithoutCancel(ctx), key, r.Mode, r.Owner)
				}
				errs <- err
			}()
			waitQueued(key, r.Mode, i+1)
		}
		if err := l.ReleaseShared(ctx, key, first.Mode, first.Owner); err != nil {
			t.Fatal(err)
		}
		var got []string
		for range waiters {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
			got = append(got, <-order)
		}
		return got
	}
	check := func(got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("granted in the order %v; want the arrival order %v", got, want)
		}
	}

	t.Run("permits", func(t *testing.T) {
		var ws []driver.SharedRequest
		var want []string
		for i := range 5 {
			ws = append(ws, sreq(driver.SharedPermit, fmt.Sprintf("w%d", i), time.Minute, 1, true))
			want = append(want, ws[i].Owner)
		}
		check(run("permits", sreq(driver.SharedPermit, "holder", time.Minute, 1, false), ws), want...)
	})
	t.Run("read-write", func(t *testing.T) {
		got := run("rw", sreq(driver.SharedWrite, "holder", time.Minute, 0, false), []driver.SharedRequest{
			sreq(driver.SharedRead, "r1", time.Minute, 0, true),
			sreq(driver.SharedWrite, "w2", time.Minute, 0, true),
			sreq(driver.SharedRead, "r3", time.Minute, 0, true),
		})
		check(got, "r1", "w2", "r3")
	})
}
