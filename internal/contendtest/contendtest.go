// Package contendtest measures a lock under contention: separate Lockers,
// standing for separate processes, take it in turns, and the benchmark
// reports the client calls per acquisition, the fairness of the shares and
// the wake latency from a release to the next grant. The Redis drivers'
// BenchmarkQueue and the etcd, PostgreSQL and file drivers'
// BenchmarkContention use it.
package contendtest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// Spec is one contention benchmark.
type Spec struct {
	// Lockers are the contenders, one per process; at least 2*Slots.
	Lockers []*locker.Locker
	// Acquire takes the lock through l, waiting for it.
	Acquire func(ctx context.Context, l *locker.Locker) (*locker.Lock, error)
	// Slots is how many Lockers may hold at once: 1 for a mutex, n for a
	// semaphore of n.
	Slots int
	// Hold is how long each grant is held.
	Hold time.Duration
	// Calls returns how many calls the clients (or the server, for the
	// backend's own count) have made so far; Run reports the difference
	// over the measured acquisitions as calls/acq. Nil: not reported.
	Calls func() int64
}

// Run warms every Locker up with two rounds of acquisitions, then makes
// b.N more, measured, and reports
//
//	calls/acq    Spec.Calls per acquisition in the measured pass
//	fairness     fewest/most acquisitions of one Locker (1 = equal shares)
//	             over the first whole rounds (a multiple of the Lockers)
//	wake-p50-us  median time from the start of a release to the next grant
func Run(b *testing.B, s Spec) {
	if len(s.Lockers) < 2*s.Slots {
		b.Fatalf("%d processes for %d slots: need at least %d", len(s.Lockers), s.Slots, 2*s.Slots)
	}
	ctx := context.Background()
	if _, _, _, err := Pass(ctx, s.Lockers, 2*len(s.Lockers), s.Hold, s.Acquire); err != nil {
		b.Fatal(err)
	}
	var before int64
	if s.Calls != nil {
		before = s.Calls()
	}
	b.ResetTimer()
	per, wakes, grants, err := Pass(ctx, s.Lockers, b.N, s.Hold, s.Acquire)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if s.Calls != nil {
		b.ReportMetric(float64(s.Calls()-before)/float64(grants), "calls/acq")
	}
	lo, hi := slices.Min(per), slices.Max(per)
	b.ReportMetric(float64(lo)/float64(max(hi, 1)), "fairness")
	if len(wakes) > 0 {
		slices.Sort(wakes)
		b.ReportMetric(float64(wakes[len(wakes)/2].Microseconds()), "wake-p50-us")
	}
}

// Pass runs one pass: every Locker takes the lock, holds it for hold,
// releases it and goes again, until target acquisitions were made; the
// waits under way then are granted in turn, not cut short. It returns each
// Locker's share of the first target acquisitions (rounded down to whole
// rounds), the time from each release's start to the next grant, and the
// acquisitions made in all.
func Pass(ctx context.Context, lockers []*locker.Locker, target int, hold time.Duration, acquire func(context.Context, *locker.Locker) (*locker.Lock, error)) (per []int64, wakes []time.Duration, grants int64, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		n          atomic.Int64
		releasedAt atomic.Int64 // unix ns of the last release's start; 0 = none
		mu         sync.Mutex
		wg         sync.WaitGroup
		firstErr   atomic.Value
	)
	// Shares are counted over whole rounds (a multiple of the Lockers), so
	// that a FIFO queue scores 1 whatever the count.
	whole := target
	if target >= len(lockers) {
		whole -= target % len(lockers)
	}
	per = make([]int64, len(lockers))
	for i, l := range lockers {
		wg.Go(func() {
			for ctx.Err() == nil {
				lk, err := acquire(ctx, l)
				if err != nil {
					if ctx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
						cancel()
					}
					return
				}
				now := time.Now().UnixNano()
				if r := releasedAt.Swap(0); r != 0 {
					mu.Lock()
					wakes = append(wakes, time.Duration(now-r))
					mu.Unlock()
				}
				k := n.Add(1)
				if k <= int64(whole) {
					per[i]++
				}
				time.Sleep(hold) // the critical section
				releasedAt.Store(time.Now().UnixNano())
				_ = lk.Release(context.Background())
				if k >= int64(target) {
					return
				}
			}
		})
	}
	wg.Wait()
	if e, _ := firstErr.Load().(error); e != nil {
		return nil, nil, 0, e
	}
	return per, wakes, n.Load(), nil
}

// Bench runs the contention benchmarks of one backend: for 8, 32 and 64
// processes, a mutex (prefix+"mutex-N") and a semaphore of 4
// (prefix+"sem4-N"), holding each grant 5ms, the two interleaved by size.
// open returns procs fresh Lockers on the backend, each its own process's;
// calls is Spec.Calls.
func Bench(b *testing.B, prefix string, open func(b *testing.B, procs int) []*locker.Locker, calls func() int64) {
	for _, procs := range []int{8, 32, 64} {
		for _, kind := range []string{"mutex", "sem4"} {
			b.Run(prefix+kind+"-"+strconv.Itoa(procs), func(b *testing.B) {
				Run(b, Spec{Lockers: open(b, procs), Acquire: Acquire(kind), Slots: Slots(kind), Hold: 5 * time.Millisecond, Calls: calls})
			})
		}
	}
}

// Acquire returns the Spec.Acquire of a kind of lock: "mutex" takes the key
// "hot", "sem4" a permit of a semaphore of 4 on it; TTL 10s, not renewed.
func Acquire(kind string) func(context.Context, *locker.Locker) (*locker.Lock, error) {
	opts := []locker.Option{locker.WithTTL(10 * time.Second), locker.WithAutoRenew(false)}
	if kind == "sem4" {
		return func(ctx context.Context, l *locker.Locker) (*locker.Lock, error) {
			return l.Semaphore("hot", 4).Acquire(ctx, opts...)
		}
	}
	return func(ctx context.Context, l *locker.Locker) (*locker.Lock, error) {
		return l.Acquire(ctx, "hot", opts...)
	}
}

// Slots returns the Spec.Slots of a kind of lock Acquire takes.
func Slots(kind string) int {
	if kind == "sem4" {
		return 4
	}
	return 1
}
