package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/opaquetest"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/sharedtest"
)

// Shared-hold scenarios both Redis drivers run (driver.SharedLocker).

// OpenShared opens a driver's Locker on a URL; it must be a SharedLocker.
type OpenShared func(u string) (driver.Locker, error)

func openShared(t testing.TB, open OpenShared, u string) driver.SharedLocker {
	t.Helper()
	d, err := open(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.(driver.SharedLocker)
}

// sharedQueued waits until n waiters stand in the queue of key's shared
// lock of mode on s.
func sharedQueued(t testing.TB, s *redistest.Server, key string, mode driver.SharedMode, n int) {
	t.Helper()
	q := rediscore.SharedKeys("", key, mode)[3]
	WaitFor(t, 10*time.Second, fmt.Sprintf("%d waiters in %q", n, q), func() bool {
		v, err := s.Do("LLEN", q)
		c, _ := v.(int64)
		return err == nil && c >= int64(n)
	})
}

// SharedCommands asserts, with MONITOR, that each shared operation on a
// single server is exactly one EVALSHA: a granted and a refused one-shot
// acquire, an owner's acquire again, a waiting acquire that fits, refresh,
// release and inspect.
func SharedCommands(t *testing.T, url func(addrs ...string) string, open OpenShared) {
	s := redistest.Start(t)
	d := openShared(t, open, url(s.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := sharedtest.Req(driver.SharedPermit, "o", time.Minute, 1, false)
	warm := func() error { // loads every script
		if _, err := d.AcquireShared(ctx, "warm", p); err != nil {
			return err
		}
		if err := d.RefreshShared(ctx, "warm", p.Mode, "o", time.Minute); err != nil {
			return err
		}
		if _, err := d.InspectShared(ctx, "warm", p.Mode); err != nil {
			return err
		}
		return d.ReleaseShared(ctx, "warm", p.Mode, "o")
	}
	if err := warm(); err != nil {
		t.Fatal(err)
	}
	m := startMonitor(t, s.Addr)
	m.take(t, s.Addr, 0)
	for i, op := range []struct {
		what string
		do   func() error
	}{
		{"acquire", func() error { _, err := d.AcquireShared(ctx, "k", p); return err }},
		{"acquire again by the owner", func() error { _, err := d.AcquireShared(ctx, "k", p); return err }},
		{"refused acquire", func() error {
			_, err := d.AcquireShared(ctx, "k", sharedtest.Req(driver.SharedPermit, "other", time.Minute, 1, false))
			if !errors.Is(err, driver.ErrNotAcquired) {
				return fmt.Errorf("want ErrNotAcquired, got %v", err)
			}
			return nil
		}},
		{"refresh", func() error { return d.RefreshShared(ctx, "k", p.Mode, "o", time.Minute) }},
		{"inspect", func() error { _, err := d.InspectShared(ctx, "k", p.Mode); return err }},
		{"release", func() error { return d.ReleaseShared(ctx, "k", p.Mode, "o") }},
		{"waiting read that fits", func() error {
			_, err := d.AcquireShared(ctx, "k", sharedtest.Req(driver.SharedRead, "o", time.Minute, 0, true))
			return err
		}},
	} {
		if err := op.do(); err != nil {
			t.Fatalf("%s: %v", op.what, err)
		}
		if got := m.take(t, s.Addr, i+1); !slices.Equal(got, []string{"evalsha"}) {
			t.Errorf("%s sent %v, want exactly one evalsha", op.what, got)
		}
	}
}

// SharedCrash: a permit holder in a child process (auto-renewing, TTL
// 300ms) is killed with SIGKILL while a waiter waits for a permit of a
// semaphore of 2 whose other permit the parent holds. The waiter is
// granted within 100ms after the dead child's lease ends (not before),
// and the parent keeps its permit.
func SharedCrash(t *testing.T, url func(addrs ...string) string, open OpenShared) {
	s := redistest.Start(t)
	u := url(s.Addr)
	a, b := openShared(t, open, u), openShared(t, open, u)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const key, ttl = "uploads", 300 * time.Millisecond
	if _, err := a.AcquireShared(ctx, key, sharedtest.Req(driver.SharedPermit, "parent", time.Minute, 2, false)); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, childURLEnv+"="+u, childKeyEnv+"="+strconv.Quote(key), childModeEnv+"=permit",
		childOwnEnv+"="+strconv.Quote("child"), childTTLEnv+"="+ttl.String())
	c.expect("permit")
	granted := make(chan time.Time, 1)
	go func() {
		_, err := b.AcquireShared(ctx, key, sharedtest.Req(driver.SharedPermit, "next", time.Minute, 2, true))
		if err != nil {
			t.Error(err)
		}
		granted <- time.Now()
	}()
	sharedQueued(t, s, key, driver.SharedPermit, 1)
	time.Sleep(2 * ttl) // the child renews: its permit outlives its TTL
	select {
	case <-granted:
		t.Fatal("the waiter was granted while the child renews its permit")
	default:
	}
	c.kill()
	_ = c.cmd.Wait()
	sharedtest.CrashReturned(t, a, key, granted)
}

// sharedChild is MaybeChild's "permit" mode: it takes a permit of a
// semaphore of 2 with auto-renewal, prints "permit", and blocks until
// killed.
func sharedChild(l *locker.Locker, key string, opts []locker.Option) {
	_, err := l.Semaphore(key, 2).TryAcquire(context.Background(), opts...)
	if err != nil {
		fmt.Println("acquire:", err)
		return
	}
	fmt.Println("permit")
	select {}
}

// SharedWriterStarvation: sharedtest.WriterStarvation on one server (8
// looping readers; the writer granted within 1s).
func SharedWriterStarvation(t *testing.T, url func(addrs ...string) string, open OpenShared) {
	s := redistest.Start(t)
	sharedtest.WriterStarvation(t, func() driver.SharedLocker { return openShared(t, open, url(s.Addr)) }, time.Second)
}

// SharedOpaque: sharedtest.Opaque (keys and owners of opaquetest.Names
// handed over and inspected) on one server, with the mutex of every key
// held all along: the permit, the write hold and the mutex of one key
// never block each other.
func SharedOpaque(t *testing.T, url func(addrs ...string) string, open OpenShared) {
	s := redistest.Start(t)
	a, b := openShared(t, open, url(s.Addr)), openShared(t, open, url(s.Addr))
	names := opaquetest.Names
	for i, key := range names {
		if _, err := a.(driver.Locker).Acquire(context.Background(), key, names[(i+1)%len(names)], time.Minute); err != nil {
			t.Fatalf("the mutex of %q: %v", key, err)
		}
	}
	sharedtest.Opaque(t, a, b, func(key string, mode driver.SharedMode) { sharedQueued(t, s, key, mode, 1) })
}

// SharedRedlockRefused: a Redlock Locker over 3 masters refuses every
// shared call, raw and through package locker, with an error matching
// errors.ErrUnsupported that names the driver and the reason, and sends
// no command to any master.
func SharedRedlockRefused(t *testing.T, name string, url func(addrs ...string) string, open OpenShared) {
	ms := redistest.StartN(t, 3)
	addrs := redistest.Addrs(ms)
	d := openShared(t, open, url(addrs...))
	mons := make([]*monitor, len(addrs))
	for i, a := range addrs {
		mons[i] = startMonitor(t, a)
		mons[i].take(t, a, 0)
	}
	ctx := context.Background()
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), name+": Redlock") ||
			!strings.Contains(err.Error(), "independent majorities") {
			t.Errorf("%s = %v; want ErrUnsupported naming %s and the reason", what, err, name)
		}
	}
	_, err := d.AcquireShared(ctx, "k", sharedtest.Req(driver.SharedPermit, "o", time.Minute, 2, true))
	want("AcquireShared", err)
	want("RefreshShared", d.RefreshShared(ctx, "k", driver.SharedRead, "o", time.Minute))
	want("ReleaseShared", d.ReleaseShared(ctx, "k", driver.SharedWrite, "o"))
	_, err = d.InspectShared(ctx, "k", driver.SharedPermit)
	want("InspectShared", err)
	want("SharedUnsupported", d.(driver.SharedRefuser).SharedUnsupported())
	l := locker.New(d.(driver.Locker))
	_, err = l.Semaphore("k", 2).TryAcquire(ctx)
	want("Semaphore.TryAcquire", err)
	_, err = l.RWMutex("k").AcquireRead(ctx)
	want("RWMutex.AcquireRead", err)
	for i, a := range addrs {
		if got := mons[i].take(t, a, 1); len(got) != 0 {
			t.Errorf("master %s got %v, want no command", a, got)
		}
	}
}

// SharedInterleaved benchmarks, interleaved in one loop on one server, an
// uncontended acquire+release of the mutex (the floor), of a semaphore
// permit and of a read hold, each through the raw driver, and reports
// each mean and the ratios permit/mutex and read/mutex.
func SharedInterleaved(b *testing.B, url func(addrs ...string) string, open OpenShared) {
	s := redistest.Start(b)
	d := openShared(b, open, url(s.Addr))
	l := d.(driver.Locker)
	ctx := context.Background()
	shared := func(mode driver.SharedMode) {
		if _, err := d.AcquireShared(ctx, "bench", sharedtest.Req(mode, "owner", 30*time.Second, 8, false)); err != nil {
			b.Fatal(err)
		}
		if err := d.ReleaseShared(ctx, "bench", mode, "owner"); err != nil {
			b.Fatal(err)
		}
	}
	var mu, sem, rd time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := l.Acquire(ctx, "bench", "owner", 30*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, "bench", "owner"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		shared(driver.SharedPermit)
		t2 := time.Now()
		shared(driver.SharedRead)
		t3 := time.Now()
		mu, sem, rd = mu+t1.Sub(t0), sem+t2.Sub(t1), rd+t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(mu.Nanoseconds())/n, "mutex-ns")
	b.ReportMetric(float64(sem.Nanoseconds())/n, "permit-ns")
	b.ReportMetric(float64(rd.Nanoseconds())/n, "read-ns")
	b.ReportMetric(float64(sem)/float64(mu), "permit/mutex")
	b.ReportMetric(float64(rd)/float64(mu), "read/mutex")
}

// Shared runs the shared-hold scenarios of a driver named name, one
// subtest each: commands (SharedCommands), crash (SharedCrash),
// writer-starvation (SharedWriterStarvation), opaque (SharedOpaque) and
// redlock-refused (SharedRedlockRefused).
func Shared(t *testing.T, name string, url func(addrs ...string) string, open OpenShared) {
	t.Run("commands", func(t *testing.T) { SharedCommands(t, url, open) })
	t.Run("crash", func(t *testing.T) { SharedCrash(t, url, open) })
	t.Run("writer-starvation", func(t *testing.T) { SharedWriterStarvation(t, url, open) })
	t.Run("opaque", func(t *testing.T) { SharedOpaque(t, url, open) })
	t.Run("redlock-refused", func(t *testing.T) { SharedRedlockRefused(t, name, url, open) })
}
