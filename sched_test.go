package locker_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// Holding 10,000 locks costs the root package a constant number of
// goroutines (its scheduler's), not some per lock.
func TestManyLocksConstantGoroutines(t *testing.T) {
	const n = 10000
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := ctxT(t, 60*time.Second)
	// The scheduler's goroutine starts with the first lock.
	first, err := l.TryAcquire(ctx, "first", locker.WithTTL(time.Minute), locker.WithMaxHold(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	locks := make([]*locker.Lock, n)
	for i := range locks {
		lk, err := l.TryAcquire(ctx, "k"+strconv.Itoa(i), locker.WithTTL(time.Minute), locker.WithMaxHold(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		locks[i] = lk
	}
	// At most a few goroutines of the runtime's or the test's own may come
	// and go meanwhile.
	if d := runtime.NumGoroutine() - before; d > 8 {
		t.Fatalf("holding %d locks added %d goroutines, want at most 8", n, d)
	}
	for _, lk := range append(locks, first) {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Locks whose renewals stall (each round trip hangs until its timeout)
// close Lost on time, at their safe deadlines and before their TTLs end on
// the server, while the Locker's scheduler has 200 renewals in flight and
// 200 deadlines falling due within 10ms. The driver declares a 200ms
// margin, so that the goroutine that sees Lost close may run up to 200ms
// late on a loaded machine.
func TestLostOnTimeUnderSchedulerLoad(t *testing.T) {
	const n = 200
	const margin = 200 * time.Millisecond
	f := newFaulty(mem.NewStore())
	l := locker.New(capable{Locker: f, caps: driver.Capabilities{DriftFixed: margin}})
	defer l.Close()
	ctx := ctxT(t, 60*time.Second)
	ttl := time.Second
	f.pauseRefresh(true)
	type watched struct {
		start time.Time
		lost  chan time.Time
	}
	ws := make([]watched, n)
	for i := range ws {
		start := time.Now()
		lk, err := l.TryAcquire(ctx, "k"+strconv.Itoa(i), locker.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan time.Time, 1)
		go func() {
			<-lk.Lost()
			ch <- time.Now()
		}()
		ws[i] = watched{start, ch}
		if i%20 == 19 {
			time.Sleep(time.Millisecond) // deadlines spread over the run
		}
	}
	for i, w := range ws {
		var at time.Time
		select {
		case at = <-w.lost:
		case <-ctx.Done():
			t.Fatalf("lock %d: Lost never closed", i)
		}
		if after := at.Sub(w.start); after >= ttl || after < ttl-margin {
			t.Fatalf("lock %d: Lost closed %v after acquire, want within [TTL - margin, TTL) = [%v, %v)",
				i, after, ttl-margin, ttl)
		}
	}
}

// The package-level TryAcquire + Release on mem allocates at most 10 more
// objects than the driver's own Acquire + Release (default telemetry, no
// SDK; auto-renew on).
func TestAcquireReleaseAllocs(t *testing.T) {
	l := locker.New(mem.NewStore().Locker())
	defer l.Close()
	ctx := context.Background()
	d := l.Driver()
	drv := testing.AllocsPerRun(200, func() {
		if _, err := d.Acquire(ctx, "drv", "owner", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, "drv", "owner"); err != nil {
			t.Fatal(err)
		}
	})
	pkg := testing.AllocsPerRun(200, func() {
		lk, err := l.TryAcquire(ctx, "pkg", locker.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("allocations per acquire+release: driver %.0f, package %.0f", drv, pkg)
	if pkg > drv+10 {
		t.Fatalf("package TryAcquire+Release allocates %.0f, the driver's Acquire+Release %.0f: want at most 10 more", pkg, drv)
	}
}
