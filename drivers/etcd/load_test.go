package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// Thousands of keepalives in flight at once: more than gRPC's flow-control
// window holds, so writes block until the answers are read. With writes
// made under the lock the receiver needs, this deadlocked and every lock's
// renewal missed its deadline; with a sender of their own, every renewal
// is answered.
func TestKeepAliveFlood(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	var ids []clientv3.LeaseID
	for range 20 {
		g, err := l.Client().Grant(ctx, 30)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, g.ID)
	}
	const n = 20000
	chs := make([]pendingRenew, n)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 50 {
		wg.Go(func() {
			for i := w; i < n; i += 50 {
				chs[i] = l.sendRenew(ids[i%len(ids)])
			}
		})
	}
	wg.Wait()
	for i, ch := range chs {
		ttl, err := awaitRenew(ctx, ch)
		if err != nil || ttl != 30 {
			t.Fatalf("renewal %d of %d: TTL %d, %v", i, n, ttl, err)
		}
	}
	t.Logf("%d keepalives answered in %v", n, time.Since(start))
}

// etcd's "too many requests" is push-back, not an answer: Acquire and
// Release retry with backoff while ctx lasts, for at most the request
// timeout, then fail with an error naming the cause.
func TestPushback(t *testing.T) {
	l := openTest(t, "?request_timeout=300ms")
	ctx := testCtx(t)
	calls := 0
	err := l.withPushback(ctx, l.acquireTurns, func(context.Context) error {
		if calls++; calls <= 3 {
			return rpctypes.ErrTooManyRequests
		}
		return nil
	})
	if err != nil || calls != 4 {
		t.Fatalf("after three push-backs: %v, %d calls", err, calls)
	}
	start := time.Now()
	err = l.withPushback(ctx, l.acquireTurns, func(context.Context) error { return rpctypes.ErrTooManyRequests })
	if !errors.Is(err, driver.ErrUnavailable) || !errors.Is(err, ErrPushback) || !tooManyRequests(err) {
		t.Fatalf("push-back for the whole request timeout: %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("gave up after %v, want about the request timeout (300ms)", d)
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	err = l.withPushback(cctx, l.acquireTurns, func(context.Context) error { return rpctypes.ErrTooManyRequests })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("push-back past ctx: %v", err)
	}
	other := errors.New("other")
	calls = 0
	if err := l.withPushback(ctx, l.acquireTurns, func(context.Context) error { calls++; return other }); err != other || calls != 1 {
		t.Fatalf("another error is not retried: %v, %d calls", err, calls)
	}
}

// Owner checks are batched, answers stay per lock: of locks refreshed
// together, only the deleted one and the one another owner took are not
// held.
func TestRefreshBatchIsolation(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	const n = 300 // more than one owner-check transaction
	for i := range n {
		if _, err := l.Acquire(ctx, fmt.Sprint(i), "o", 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Client().Delete(ctx, l.LockKey("7")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client().Delete(ctx, l.LockKey("131")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client().Put(ctx, l.LockKey("131"), "other"); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = l.Refresh(ctx, fmt.Sprint(i), "o", 10*time.Second) })
	}
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == 7 || i == 131:
			if !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("refresh %d: %v, want ErrNotHeld", i, err)
			}
		case err != nil:
			t.Errorf("refresh %d: %v", i, err)
		}
	}
}
