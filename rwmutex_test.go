package locker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/drivers/mem"
)

// 32 Lockers mix reads and writes: a writer never overlaps anyone, and
// every token is above those of the holds released before its request.
func TestRWMutexUnderContention(t *testing.T) {
	const procs, rounds = 32, 15
	ls := lockers(t, mem.NewStore(), procs)
	ctx := ctxT(t, time.Minute)
	var readers, writers, peakReaders atomic.Int64
	var f fence
	var wg sync.WaitGroup
	for i, l := range ls {
		wg.Go(func() {
			rw := l.RWMutex("catalog")
			for r := range rounds {
				write := (i+r)%4 == 0
				floor := f.floor()
				acquire := rw.AcquireRead
				if write {
					acquire = rw.AcquireWrite
				}
				lk, err := acquire(ctx, locker.WithTTL(5*time.Second))
				if err != nil {
					t.Error(err)
					return
				}
				f.grant(t, floor, lk.Token())
				if write {
					if w := writers.Add(1); w != 1 || readers.Load() != 0 {
						t.Errorf("writer granted beside %d writers and %d readers", w-1, readers.Load())
					}
				} else {
					cur := readers.Add(1)
					for p := peakReaders.Load(); cur > p && !peakReaders.CompareAndSwap(p, cur); p = peakReaders.Load() {
					}
					if writers.Load() != 0 {
						t.Error("reader granted beside a writer")
					}
				}
				time.Sleep(100 * time.Microsecond)
				if write {
					writers.Add(-1)
				} else {
					readers.Add(-1)
				}
				f.release(lk.Token())
				if err := lk.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if peakReaders.Load() < 2 {
		t.Fatalf("readers never shared the lock (peak %d)", peakReaders.Load())
	}
}

// A waiting writer blocks the readers that arrive after it, and is granted
// once the readers that held before it have released.
func TestRWMutexWriterPreference(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 11)
	ctx := ctxT(t, 30*time.Second)
	var early []*locker.Lock
	for _, l := range ls[:8] {
		lk, err := l.RWMutex("k").TryAcquireRead(ctx)
		if err != nil {
			t.Fatal(err)
		}
		early = append(early, lk)
	}
	type grant struct {
		lk  *locker.Lock
		err error
	}
	wch := make(chan grant, 1)
	go func() {
		lk, err := ls[8].RWMutex("k").AcquireWrite(ctx)
		wch <- grant{lk, err}
	}()
	// Once the writer waits, a read fails at once though only readers hold.
	waitFor(t, 5*time.Second, "the writer to queue", func() bool {
		lk, err := ls[9].RWMutex("k").TryAcquireRead(ctx)
		if err == nil {
			_ = lk.Release(ctx)
		}
		return errors.Is(err, locker.ErrNotAcquired)
	})
	rch := make(chan grant, 1)
	go func() {
		lk, err := ls[10].RWMutex("k").AcquireRead(ctx)
		rch <- grant{lk, err}
	}()
	for _, lk := range early {
		select {
		case g := <-wch:
			t.Fatalf("writer granted (%v) while readers that held before it still hold", g.err)
		case g := <-rch:
			t.Fatalf("a reader that came after the writer was granted first (%v)", g.err)
		default:
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var w grant
	select {
	case w = <-wch:
	case <-time.After(5 * time.Second):
		t.Fatal("writer not granted after the earlier readers released")
	}
	if w.err != nil {
		t.Fatal(w.err)
	}
	select {
	case g := <-rch:
		t.Fatalf("a reader was granted beside the writer (%v)", g.err)
	default:
	}
	if err := w.lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-rch
	if r.err != nil || r.lk.Token() <= w.lk.Token() {
		t.Fatalf("late reader: %v, token not above the writer's %d", r.err, w.lk.Token())
	}
}

// 8 readers loop, their holds overlapping, while a writer asks: the writer
// is granted within the life of the reads in force when it arrived.
func TestRWMutexWriterNotStarved(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 9)
	ctx := ctxT(t, 30*time.Second)
	const hold = 20 * time.Millisecond
	stop := make(chan struct{})
	started := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for _, l := range ls[:8] {
		wg.Go(func() {
			rw := l.RWMutex("k")
			for first := true; ; first = false {
				select {
				case <-stop:
					return
				default:
				}
				lk, err := rw.AcquireRead(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if first {
					started <- struct{}{}
				}
				time.Sleep(hold)
				_ = lk.Release(ctx)
			}
		})
	}
	defer wg.Wait()
	defer close(stop)
	for range 8 {
		<-started
	}
	asked := time.Now()
	w, err := ls[8].RWMutex("k").AcquireWrite(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(asked); d > hold+time.Second {
		t.Fatalf("writer waited %v behind readers that hold %v each", d, hold)
	}
	_ = w.Release(ctx)
}

// An owner that holds the read lock and asks for the write lock (or the
// reverse) gets ErrInvalid at once, not a deadlock; its hold is untouched.
func TestRWMutexNoUpgrade(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 2)
	ctx := ctxT(t, 10*time.Second)
	r, err := ls[0].RWMutex("k").AcquireRead(ctx, locker.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls[1].RWMutex("k").AcquireRead(ctx); err != nil {
		t.Fatal(err) // another reader, so the write could never be granted
	}
	start := time.Now()
	for what, call := range map[string]func() error{
		"AcquireWrite":    func() error { _, err := ls[0].RWMutex("k").AcquireWrite(ctx, locker.WithOwner("me")); return err },
		"TryAcquireWrite": func() error { _, err := ls[1].RWMutex("k").TryAcquireWrite(ctx, locker.WithOwner("me")); return err },
		"DoWrite": func() error {
			return ls[0].RWMutex("k").DoWrite(ctx, func(context.Context) error { return nil }, locker.WithOwner("me"))
		},
	} {
		if err := call(); !errors.Is(err, locker.ErrInvalid) {
			t.Errorf("%s by the reader: got %v, want ErrInvalid", what, err)
		}
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("upgrades took %v to fail", d)
	}
	mustOpen(t, r.Lost(), "read hold lost after an upgrade attempt")
	if err := r.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	again, err := ls[1].RWMutex("k").AcquireRead(ctx, locker.WithOwner("me"))
	if err != nil || again.Token() != r.Token() {
		t.Fatalf("read again by its owner: %v, %v; want token %d", again, err, r.Token())
	}

	w, err := ls[0].RWMutex("w").AcquireWrite(ctx, locker.WithOwner("writer"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ls[1].RWMutex("w").AcquireRead(ctx, locker.WithOwner("writer")); !errors.Is(err, locker.ErrInvalid) {
		t.Fatalf("read by the writer: got %v, want ErrInvalid", err)
	}
	_ = w.Release(ctx)
}

// DoRead and DoWrite run fn under the hold and release it.
func TestRWMutexDo(t *testing.T) {
	ls := lockers(t, mem.NewStore(), 1)
	ctx := ctxT(t, 10*time.Second)
	rw := ls[0].RWMutex("k")
	kinds := map[string]bool{}
	for _, do := range []func(context.Context, func(context.Context) error, ...locker.Option) error{rw.DoRead, rw.DoWrite} {
		if err := do(ctx, func(ctx context.Context) error {
			hs, err := rw.Inspect(ctx)
			if err != nil || len(hs) != 1 {
				t.Errorf("inside: %+v, %v", hs, err)
			} else {
				kinds[hs[0].Kind] = true
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if !kinds["read"] || !kinds["write"] {
		t.Fatalf("kinds seen: %v", kinds)
	}
	if hs, err := rw.Inspect(ctx); err != nil || len(hs) != 0 {
		t.Fatalf("after Do: %+v, %v", hs, err)
	}
}
