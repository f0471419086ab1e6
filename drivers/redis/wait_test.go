package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

func numsub(t *testing.T, s *redistest.Server, channel string) int64 {
	t.Helper()
	v, err := s.Do("PUBSUB", "NUMSUB", channel)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := v.([]any)[1].(int64)
	return n
}

// commandCalls returns the calls count of cmd in INFO commandstats.
func commandCalls(t testing.TB, s *redistest.Server, cmd string) int64 {
	t.Helper()
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(v.(string), "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconvAtoi64(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

func woken(t *testing.T, what string, c <-chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no wake-up", what)
	}
}

func drainWake(c <-chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

// Many local waiters on one key share one SUBSCRIBE on one connection, and
// all of them are woken by one release.
func TestWaitersShareOneSubscription(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL())
	holder := openT(t, s.URL())
	ctx := context.Background()
	if _, err := holder.Acquire(ctx, "k", "h", time.Minute); err != nil {
		t.Fatal(err)
	}
	const n = 20
	wakes := make([]<-chan struct{}, n)
	cancels := make([]func(), n)
	done := make(chan int, n)
	for i := range n {
		go func() {
			w, c, err := l.Subscribe(ctx, "k")
			if err != nil {
				t.Error(err)
			}
			wakes[i], cancels[i] = w, c
			done <- i
		}()
	}
	for range n {
		<-done
	}
	if t.Failed() {
		t.FailNow()
	}
	if got := numsub(t, s, "locker:{k}"); got != 1 {
		t.Fatalf("PUBSUB NUMSUB = %d, want 1", got)
	}
	if got := commandCalls(t, s, "subscribe"); got != 1 {
		t.Fatalf("%d SUBSCRIBE commands, want 1", got)
	}
	if err := holder.Release(ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	for i, w := range wakes {
		woken(t, "waiter "+itoa(i), w)
	}
	for _, c := range cancels {
		c()
		c()
	}
	drivertest.WaitFor(t, 20*time.Second, "unsubscribe", func() bool { return numsub(t, s, "locker:{k}") == 0 })
}

// A release of another key does not wake; a waiter of a key whose holder
// was taken over by expiry is woken by the next release.
func TestWakeOnlyForItsKey(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL())
	ctx := context.Background()
	wa, ca, err := l.Subscribe(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer ca()
	wb, cb, err := l.Subscribe(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer cb()
	if _, err := l.Acquire(ctx, "b", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, "b", "o"); err != nil {
		t.Fatal(err)
	}
	woken(t, "b", wb)
	// b's wake was delivered through the same connection after any for a,
	// so a has none pending.
	select {
	case <-wa:
		t.Fatal("a woken by b's release")
	default:
	}
	// A failed release (not the owner) publishes nothing.
	if err := l.Release(ctx, "a", "nobody"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatal(err)
	}
}

// A lost pub/sub connection wakes every waiter; once go-redis has
// resubscribed, releases wake them again.
func TestWaitAcrossServerRestart(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL())
	ctx := context.Background()
	w, cancel, err := l.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	s.Kill()
	woken(t, "connection lost", w)
	s.Restart()
	drivertest.WaitFor(t, 30*time.Second, "resubscribed", func() bool { return numsub(t, s, "locker:{k}") == 1 })
	woken(t, "resubscribed", w) // the resubscription itself wakes (a release may have been missed)
	drainWake(w)
	other := openT(t, s.URL())
	if _, err := other.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, "k", "o"); err != nil {
		t.Fatal(err)
	}
	woken(t, "release after restart", w)
}

func TestSubscribeContextAndClose(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL())
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := l.Subscribe(cctx, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("subscribe with done ctx = %v", err)
	}
	// A frozen server: Subscribe returns at the deadline. (A fresh key: the
	// cancelled SUBSCRIBE above may still have reached the server, and its
	// late confirmation rightly satisfies a later subscription to "k".)
	s.Stop()
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	start := time.Now()
	if _, _, err := l.Subscribe(dctx, "k-frozen"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("subscribe on frozen server = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("subscribe returned %v after its deadline", d)
	}
	s.Cont()
	w, _, err := l.Subscribe(context.Background(), "k2")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	woken(t, "close", w)
	if _, _, err := l.Subscribe(context.Background(), "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("subscribe after close = %v", err)
	}
}

// Redlock waits subscribe on a quorum: fine with two of five down, an
// error with three down.
func TestRedlockSubscribe(t *testing.T) {
	ms := redistest.StartN(t, 5)
	addrs := redistest.Addrs(ms)
	dsn := urlOf(addrs...) + "?node_timeout=300ms&dial_timeout=300ms"
	l := openT(t, dsn)
	holder := openT(t, dsn)
	ctx := context.Background()
	ms[0].Kill()
	ms[1].Kill()
	if _, err := holder.Acquire(ctx, "k", "h", time.Minute); err != nil {
		t.Fatal(err)
	}
	w, cancel, err := l.Subscribe(ctx, "k")
	if err != nil {
		t.Fatalf("subscribe with 2 of 5 down: %v", err)
	}
	drainWake(w)
	if err := holder.Release(ctx, "k", "h"); err != nil {
		t.Fatal(err)
	}
	woken(t, "release", w)
	cancel()
	ms[2].Kill()
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	_, _, err = l.Subscribe(sctx, "k")
	if err == nil || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("subscribe with 3 of 5 down = %v, want a quorum error", err)
	}
}

// On a Cluster, the release script runs on the key's node and its PUBLISH
// reaches the waiter's pub/sub connection wherever that is; keys with
// braces work too (no CROSSSLOT).
func TestClusterWaitAndKeys(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	dsn := urlOf(c.Addrs()...) + "?cluster=true"
	l := openT(t, dsn)
	holder := openT(t, dsn)
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c", "d", "{user1}", "x}y{z", "}"} {
		if _, err := holder.Acquire(ctx, key, "h", time.Minute); err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		w, cancel, err := l.Subscribe(ctx, key)
		if err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		if _, err := l.Acquire(ctx, key, "w", time.Minute); !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("%q: acquire while held = %v", key, err)
		}
		if err := holder.Release(ctx, key, "h"); err != nil {
			t.Fatalf("%q: %v", key, err)
		}
		woken(t, key, w)
		if _, err := l.Acquire(ctx, key, "w", time.Minute); err != nil {
			t.Fatalf("%q: acquire after release: %v", key, err)
		}
		cancel()
	}
}
