package locker_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/drivers/mem"
)

func TestAmbiguousAcquireLeavesNothing(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	f.lostReply = true
	l := locker.New(f)
	ctx := ctxT(t, 10*time.Second)
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, errTransient) {
		t.Fatalf("TryAcquire: %v", err)
	}
	l.Close() // waits for the background clean-up
	if _, err := st.Locker().Acquire(ctx, "k", "other", time.Second); err != nil {
		t.Fatalf("key left held after an ambiguous acquire: %v", err)
	}
}

// The clean-up of a lost reply tries its Release again while it fails
// without an answer (a node timeout while the network is cut), so the
// grant ends long before its TTL.
func TestLostReplyCleanupRetries(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	f.lostReply = true
	f.failReleases.Store(3)
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute)); !errors.Is(err, errTransient) {
		t.Fatalf("TryAcquire: %v", err)
	}
	probe := st.Locker()
	waitFor(t, 3*time.Second, "the clean-up to free the key after 3 failed Releases", func() bool {
		_, err := probe.Acquire(ctx, "k", "other", time.Second)
		return err == nil
	})
	if n := f.releases.Load(); n != 4 {
		t.Fatalf("the clean-up made %d Release calls, want 4 (3 failed, 1 answered)", n)
	}
}

func TestLocalWaitersShareOneWait(t *testing.T) {
	st := mem.NewStore()
	w := waiting{newFaulty(st)}
	l := locker.New(w)
	defer l.Close()
	holder := locker.New(st.Locker())
	defer holder.Close()
	ctx := ctxT(t, 60*time.Second)
	lk, err := holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 16
	var wg sync.WaitGroup
	var order sync.Mutex
	var tokens []uint64
	started := make(chan struct{}, waiters)
	for range waiters {
		wg.Go(func() {
			started <- struct{}{}
			lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			order.Lock()
			tokens = append(tokens, lk.Token())
			order.Unlock()
			if err := lk.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	for range waiters {
		<-started
	}
	// Wait until every waiter made its first attempt (each makes one
	// before queueing), then release.
	deadline := time.Now().Add(10 * time.Second)
	for w.acquires.Load() < waiters+1 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d attempts", w.acquires.Load())
		}
		time.Sleep(time.Millisecond)
	}
	before := w.acquires.Load()
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if !slices.IsSorted(tokens) || len(tokens) != waiters {
		t.Fatalf("tokens %v", tokens)
	}
	perHandoff := float64(w.acquires.Load()-before) / waiters
	t.Logf("%d subscriptions, %.1f driver acquires per handoff", w.subscribes.Load(), perHandoff)
	if perHandoff > 3 {
		t.Fatalf("%.1f driver acquires per handoff with %d local waiters: waiters stampede", perHandoff, waiters)
	}
	if s := w.subscribes.Load(); s > 2 {
		t.Fatalf("%d subscriptions for one key in one Locker", s)
	}
}

func TestBlockingAcquirer(t *testing.T) {
	st := mem.NewStore()
	b := &blocking{faulty: newFaulty(st)}
	l := locker.New(b)
	holder := locker.New(st.Locker())
	defer holder.Close()
	ctx := ctxT(t, 30*time.Second)
	lk, err := holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		lk, err := l.Acquire(ctx, "k")
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for b.waits.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("AcquireWait never called")
		}
		time.Sleep(time.Millisecond)
	}
	lk.Release(ctx)
	if err := <-got; err != nil {
		t.Fatalf("Acquire through AcquireWait: %v", err)
	}

	lk, err = holder.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	go func() {
		_, err := l.Acquire(ctx, "k")
		got <- err
	}()
	for b.waits.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("AcquireWait not called again")
		}
		time.Sleep(time.Millisecond)
	}
	l.Close()
	select {
	case err := <-got:
		if !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("blocked Acquire after Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Acquire did not return after Close")
	}
}

func TestTakeoverAtHolderTTL(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st) // no Waiter
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	ttl := 1200 * time.Millisecond
	start := time.Now()
	if _, err := st.Locker().Acquire(ctx, "k", "crashed", ttl); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	late := time.Since(start) - ttl
	t.Logf("taken over %v after the holder's TTL, %d attempts", late, f.acquires.Load())
	if late < 0 {
		t.Fatalf("taken over before the TTL")
	}
	// The wake-up at the holder's remaining TTL makes takeover prompt;
	// without it the backoff (5ms doubling to 500ms) lands up to 500ms late.
	if late > 100*time.Millisecond {
		t.Fatalf("taken over %v after the holder's TTL, want within 100ms", late)
	}
	if n := f.acquires.Load(); n > 12 {
		t.Fatalf("%d attempts while waiting %v for a crashed holder", n, ttl)
	}
}

func TestWaitSurvivesTransientErrors(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st) // no Waiter: attempts come from the backoff
	l := locker.New(f)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	holder := st.Locker()
	if _, err := holder.Acquire(ctx, "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	got := make(chan *locker.Lock, 1)
	go func() {
		lk, err := l.Acquire(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	deadline := time.Now().Add(10 * time.Second)
	for f.acquires.Load() < 2 { // waiting
		if time.Now().After(deadline) {
			t.Fatal("waiter never retried")
		}
		time.Sleep(time.Millisecond)
	}
	f.lostReplies.Store(3) // the next three grants "lose their reply"
	if err := holder.Release(ctx, "k", "holder"); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	defer lk.Release(ctx)
	for f.releases.Load() < 3 { // the three clean-ups ran
		if time.Now().After(deadline) {
			t.Fatalf("%d clean-ups", f.releases.Load())
		}
		time.Sleep(time.Millisecond)
	}
	if err := lk.Refresh(ctx, time.Minute); err != nil {
		t.Fatalf("the lock won after transient errors was freed by a clean-up: %v", err)
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil || in.Token != lk.Token() {
		t.Fatalf("Inspect = %+v, %v; want token %d", in, err, lk.Token())
	}
}

func TestWaitReportsLastTransientError(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	if _, err := st.Locker().Acquire(context.Background(), "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	f.setFailAcquire(errTransient, 1) // from the second attempt on
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := l.Acquire(ctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errTransient) {
		t.Fatalf("Acquire = %v, want the deadline and the last transient error", err)
	}
}

func TestLongBlockingWaitRefreshes(t *testing.T) {
	st := mem.NewStore()
	b := &blocking{faulty: newFaulty(st)}
	l := locker.New(b)
	defer l.Close()
	ctx := ctxT(t, 30*time.Second)
	holder := st.Locker()
	if _, err := holder.Acquire(ctx, "k", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	ttl := time.Second
	time.AfterFunc(2*ttl, func() { holder.Release(context.Background(), "k", "holder") })
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	mustOpen(t, lk.Lost(), "a lock granted after a long wait was presumed lost at once")
	if n := b.refreshes.Load(); n != 1 {
		t.Fatalf("%d refreshes after the long wait, want 1", n)
	}
	// It lives its full TTL from then.
	waitClosed(t, lk.Lost(), 10*time.Second, "Lost")
}

// Acquire's ctx bounds the wait only: cancelling it after the grant ends
// neither the lock nor its renewal.
func TestAcquireContextBoundsWaitOnly(t *testing.T) {
	st := mem.NewStore()
	f := newFaulty(st)
	l := locker.New(f)
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	const ttl = 300 * time.Millisecond
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	// Three TTLs later the lock is still held and has been renewed.
	select {
	case <-lk.Lost():
		t.Fatalf("Lost closed after the Acquire context was cancelled: %v", lk.Err())
	case <-time.After(3 * ttl):
	}
	if n := f.refreshes.Load(); n < 3 {
		t.Fatalf("%d renewals in 3 TTLs after the Acquire context was cancelled", n)
	}
	if _, err := st.Locker().Acquire(ctxT(t, 5*time.Second), "k", "other", ttl); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("another owner's Acquire: %v, want ErrNotAcquired", err)
	}
	if err := lk.Release(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
}
