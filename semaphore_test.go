package locker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// lockers returns n Lockers on one store, each standing for a process.
func lockers(t *testing.T, s *mem.Store, n int) []*locker.Locker {
	t.Helper()
	ls := make([]*locker.Locker, n)
	for i := range ls {
		ls[i] = locker.New(s.Locker())
		t.Cleanup(func() { _ = ls[i].Close() })
	}
	return ls
}

// fence stands for a resource that checks fencing tokens: every grant must
// carry a token above every token of a hold released before it was asked
// for, and no token may be granted twice.
type fence struct {
	mu       sync.Mutex
	released uint64
	seen     map[uint64]bool
}

func (f *fence) floor() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.released
}

func (f *fence) grant(t *testing.T, floor, token uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seen == nil {
		f.seen = map[uint64]bool{}
	}
	if token <= floor || f.seen[token] {
		t.Errorf("token %d: not above %d, the highest released before the request, or granted twice", token, floor)
	}
	f.seen[token] = true
}

func (f *fence) release(token uint64) {
	f.mu.Lock()
	f.released = max(f.released, token)
	f.mu.Unlock()
}

// 32 Lockers contend for a semaphore of 4: never more than 4 holders, and
// every token above those of the holds released before it.
func TestSemaphoreLimitUnderContention(t *testing.T) {
	const procs, n, rounds = 32, 4, 15
	ls := lockers(t, mem.NewStore(), procs)
	ctx := ctxT(t, time.Minute)
	var inUse, peak atomic.Int64
	var f fence
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() {
			sem := l.Semaphore("uploads", n)
			for range rounds {
				floor := f.floor()
				lk, err := sem.Acquire(ctx, locker.WithTTL(5*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				f.grant(t, floor, lk.Token())
				cur := inUse.Add(1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				time.Sleep(100 * time.Microsecond)
				inUse.Add(-1)
				f.release(lk.Token())
				if err := lk.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > n || p < 2 {
		t.Fatalf("peak holders %d, want 2..%d", p, n)
	}
}

// Callers with different limits never admit more than the largest: the
// grant is made only while fewer than the caller's own n hold the key.
func TestSemaphorePerCallLimit(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 4)
	ctx := ctxT(t, 10*time.Second)
	var held []*locker.Lock
	for i := range 3 {
		lk, err := ls[i].Semaphore("k", 4).TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, lk)
	}
	if _, err := ls[3].Semaphore("k", 2).TryAcquire(ctx); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("n=2 with 3 holders: got %v, want ErrNotAcquired", err)
	}
	if _, err := ls[3].Semaphore("k", 3).TryAcquire(ctx); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("n=3 with 3 holders: got %v, want ErrNotAcquired", err)
	}
	lk, err := ls[3].Semaphore("k", 8).TryAcquire(ctx)
	if err != nil {
		t.Fatalf("n=8 with 3 holders: %v", err)
	}
	held = append(held, lk)
	hs, err := ls[0].Semaphore("k", 4).Inspect(ctx)
	if err != nil || len(hs) != 4 {
		t.Fatalf("Inspect: %v holders, err %v; want 4", len(hs), err)
	}
	for _, lk := range held {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Concurrently, with limits 1 to 4 mixed: never more than 4.
	var inUse, peak atomic.Int64
	var wg sync.WaitGroup
	for i, l := range lockers(t, mem.NewStore(), 16) {
		wg.Go(func() {
			sem := l.Semaphore("k", 1+i%4)
			for range 10 {
				lk, err := sem.Acquire(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				cur := inUse.Add(1)
				for p := peak.Load(); cur > p && !peak.CompareAndSwap(p, cur); p = peak.Load() {
				}
				time.Sleep(100 * time.Microsecond)
				inUse.Add(-1)
				_ = lk.Release(ctx)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 4 {
		t.Fatalf("peak holders %d with limits 1..4", p)
	}
}

// A holder that crashed (nothing renews its permit) gives it back after its
// TTL, while the other holder keeps its own.
func TestSemaphoreCrashedHolderExpires(t *testing.T) {
	s := mem.NewStore()
	ctx := ctxT(t, 10*time.Second)
	const ttl = 300 * time.Millisecond
	crashed := s.Locker().(driver.SharedLocker)
	sent := time.Now()
	if _, err := crashed.AcquireShared(ctx, "k", driver.SharedRequest{Mode: driver.SharedPermit, Owner: "crashed", TTL: ttl, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	ls := lockers(t, s, 2)
	alive, err := ls[0].Semaphore("k", 2).Acquire(ctx, locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := ls[1].Semaphore("k", 2).Acquire(ctx, locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(sent)
	if waited < ttl-ttl/100-2*time.Millisecond || waited > ttl+100*time.Millisecond {
		t.Fatalf("the permit came back %v after the crashed holder's grant, want its TTL %v (+100ms at most)", waited, ttl)
	}
	mustOpen(t, alive.Lost(), "the live holder lost its permit")
	hs, err := ls[0].Semaphore("k", 2).Inspect(ctx)
	if err != nil || len(hs) != 2 || hs[0].Owner == "crashed" || hs[1].Owner == "crashed" {
		t.Fatalf("Inspect = %+v, %v; want the two live holders", hs, err)
	}
	_ = lk.Release(ctx)
	_ = alive.Release(ctx)
}

// Bad limits fail with ErrInvalid before any I/O; a driver without shared
// holds fails with errors.ErrUnsupported, naming it, before any I/O.
func TestSemaphoreBadInput(t *testing.T) {
	s := mem.NewStore()
	l := locker.New(s.Locker())
	defer l.Close()
	ctx := ctxT(t, 10*time.Second)
	for _, n := range []int{0, -1, locker.MaxSemaphoreLimit + 1} {
		sem := l.Semaphore("k", n)
		_, err1 := sem.Acquire(ctx)
		_, err2 := sem.TryAcquire(ctx)
		err3 := sem.Do(ctx, func(context.Context) error { t.Error("fn ran"); return nil })
		_, err4 := sem.Inspect(ctx)
		for i, err := range []error{err1, err2, err3, err4} {
			if !errors.Is(err, locker.ErrInvalid) {
				t.Errorf("n=%d call %d: got %v, want ErrInvalid", n, i, err)
			}
		}
	}
	if hs, err := l.Semaphore("k", 1).Inspect(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("after bad input: %+v, %v; want nothing held", hs, err)
	}
	if _, err := l.Semaphore("k", locker.MaxSemaphoreLimit).TryAcquire(ctx); err != nil {
		t.Fatalf("n = MaxSemaphoreLimit: %v", err)
	}

	f := newFaulty(s)
	u := locker.New(f)
	defer u.Close()
	_, err1 := u.Semaphore("k", 2).Acquire(ctx)
	_, err2 := u.RWMutex("k").TryAcquireWrite(ctx)
	_, err3 := u.RWMutex("k").Inspect(ctx)
	for i, err := range []error{err1, err2, err3} {
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(fmt.Sprint(err), "faulty") {
			t.Errorf("call %d without driver.SharedLocker: got %v, want errors.ErrUnsupported naming the driver", i, err)
		}
	}
	if n := f.acquires.Load() + f.releases.Load(); n != 0 {
		t.Fatalf("%d driver calls without driver.SharedLocker", n)
	}
}

// A mutex, a semaphore and a read-write lock on one key string are three
// different locks.
func TestSharedNamespaces(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 2)
	ctx := ctxT(t, 10*time.Second)
	m, err := ls[0].TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p, err := ls[0].Semaphore("k", 1).TryAcquire(ctx)
	if err != nil {
		t.Fatalf("semaphore beside a held mutex: %v", err)
	}
	w, err := ls[0].RWMutex("k").TryAcquireWrite(ctx)
	if err != nil {
		t.Fatalf("write lock beside a held mutex and permit: %v", err)
	}
	if p.Token() <= m.Token() || w.Token() <= p.Token() {
		t.Fatalf("tokens %d, %d, %d do not increase", m.Token(), p.Token(), w.Token())
	}
	for what, try := range map[string]func() error{
		"mutex":     func() error { _, err := ls[1].TryAcquire(ctx, "k"); return err },
		"semaphore": func() error { _, err := ls[1].Semaphore("k", 1).TryAcquire(ctx); return err },
		"read":      func() error { _, err := ls[1].RWMutex("k").TryAcquireRead(ctx); return err },
	} {
		if err := try(); !errors.Is(err, locker.ErrNotAcquired) {
			t.Errorf("%s while held: got %v, want ErrNotAcquired", what, err)
		}
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Releasing the permit frees the semaphore only.
	mustOpen(t, m.Lost(), "mutex lost")
	mustOpen(t, w.Lost(), "write lock lost")
	if _, err := ls[1].RWMutex("k").TryAcquireRead(ctx); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("read after the permit's release: got %v, want ErrNotAcquired", err)
	}
	hs, err := ls[1].RWMutex("k").Inspect(ctx)
	if err != nil || len(hs) != 1 || hs[0].Kind != "write" || hs[0].Token != w.Token() {
		t.Fatalf("RWMutex.Inspect = %+v, %v; want the writer", hs, err)
	}
	in, err := ls[1].Inspect(ctx, "k")
	if err != nil || in.Kind != "mutex" || in.Token != m.Token() {
		t.Fatalf("Locker.Inspect = %+v, %v; want the mutex holder", in, err)
	}
}

// A permit's Lock behaves as a mutex's: idempotent acquire by its owner,
// renewal past the TTL, loss at the safe deadline without renewal, loss
// reported when the server no longer has it, release by Close.
func TestSemaphoreLockBehaviour(t *testing.T) {
	s := mem.NewStore()
	ls := lockers(t, s, 2)
	ctx := ctxT(t, 10*time.Second)
	sem := ls[0].Semaphore("k", 2)
	a, err := sem.TryAcquire(ctx, locker.WithOwner("me"), locker.WithTTL(90*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	again, err := ls[1].Semaphore("k", 2).TryAcquire(ctx, locker.WithOwner("me"), locker.WithAutoRenew(false))
	if err != nil || again.Token() != a.Token() {
		t.Fatalf("same owner again: token %v, err %v; want %d", again, err, a.Token())
	}
	// Renewal keeps the hold alive for several TTLs.
	time.Sleep(300 * time.Millisecond)
	mustOpen(t, a.Lost(), "renewed permit lost")
	hs, _ := sem.Inspect(ctx)
	if len(hs) != 1 || hs[0].Owner != "me" {
		t.Fatalf("Inspect = %+v, want the renewed holder", hs)
	}
	// The hold gone from the server (released by its owner elsewhere):
	// the next renewal reports the loss.
	if err := s.Locker().(driver.SharedLocker).ReleaseShared(ctx, "k", driver.SharedPermit, "me"); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, a.Lost(), time.Second, "loss of a permit released elsewhere")
	if !errors.Is(a.Err(), locker.CauseExpired) {
		t.Fatalf("Err = %v, want CauseExpired", a.Err())
	}

	b, err := sem.TryAcquire(ctx, locker.WithMaxHold(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	waitClosed(t, b.Lost(), time.Second, "WithMaxHold on a permit")
	waitFor(t, time.Second, "the permit freed after max hold", func() bool {
		hs, _ := sem.Inspect(ctx)
		return len(hs) == 0
	})

	c, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls[0].Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, c.Lost(), time.Second, "Close")
	if !errors.Is(c.Err(), locker.CauseClosed) {
		t.Fatalf("Err = %v, want CauseClosed", c.Err())
	}
	if hs, err := ls[1].Semaphore("k", 2).Inspect(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("after Close: %+v, %v; want nothing held", hs, err)
	}
	if _, err := sem.TryAcquire(ctx); !errors.Is(err, locker.ErrClosed) {
		t.Fatalf("after Close: got %v, want ErrClosed", err)
	}
}

// Do runs fn under a permit and releases it; a cancelled Acquire leaves
// nothing held or queued.
func TestSemaphoreDoAndCancel(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 2)
	ctx := ctxT(t, 10*time.Second)
	sem := ls[0].Semaphore("k", 1)
	ran := false
	err := sem.Do(ctx, func(ctx context.Context) error {
		ran = true
		hs, err := sem.Inspect(ctx)
		if len(hs) != 1 {
			t.Errorf("inside Do: %+v, %v", hs, err)
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: %v (ran %v)", err, ran)
	}
	lk, err := sem.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("after Do: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := ls[1].Semaphore("k", 1).Acquire(wctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire with a short ctx: got %v, want DeadlineExceeded", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The cancelled waiter is gone: a Try succeeds at once.
	if _, err := ls[1].Semaphore("k", 1).TryAcquire(ctx); err != nil {
		t.Fatalf("after a cancelled waiter: %v", err)
	}
}

// Close ends a waiting Acquire with ErrClosed and leaves nothing queued.
func TestSemaphoreCloseWhileWaiting(t *testing.T) {
	s := mem.NewStore()
	ls := lockers(t, s, 2)
	ctx := ctxT(t, 10*time.Second)
	held, err := ls[0].RWMutex("k").AcquireWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := ls[1].RWMutex("k").AcquireRead(ctx)
		errc <- err
	}()
	// Whether Close comes before the read reaches the driver or while it
	// waits there, the read must end with ErrClosed.
	if err := ls[1].Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("waiting AcquireRead after Close: got %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiting AcquireRead did not return after Close")
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if hs, err := ls[0].RWMutex("k").Inspect(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("after the writer's release: %+v, %v; want nothing (the closed waiter left no hold)", hs, err)
	}
}
