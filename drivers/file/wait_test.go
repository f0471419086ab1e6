package file

import (
	"context"
	"os"
	"testing"
	"time"
)

func subscribe(t *testing.T, l *Locker, key string) <-chan struct{} {
	t.Helper()
	wake, cancel, err := l.Subscribe(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	return wake
}

func waitWake(t *testing.T, wake <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(30 * time.Second):
		t.Fatalf("no wake-up on %s", what)
	}
}

func noWake(t *testing.T, wake <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-wake:
		t.Fatalf("woken by %s", what)
	default:
	}
}

func TestSubscribeWakesOnRelease(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	if _, err := a.Acquire(ctx, "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	wake := subscribe(t, b, "k")
	other := subscribe(t, b, "other")
	// A refresh and another key's release do not wake: they free nothing.
	if err := a.Refresh(ctx, "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "other", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, "other", "A"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, other, "release of other")
	noWake(t, wake, "a refresh or another key")
	if err := a.Release(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "release")
}

func TestSubscribeWakesOnExpiry(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	wake := subscribe(t, b, "k") // before the grant: the timer follows writes
	start := time.Now()
	const ttl = 100 * time.Millisecond
	if _, err := a.Acquire(ctx, "k", "A", ttl); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "expiry")
	if el := time.Since(start); el < ttl {
		t.Fatalf("woken %v after the grant, before the ttl %v", el, ttl)
	}
	if _, err := b.Acquire(ctx, "k", "B", time.Minute); err != nil {
		t.Fatalf("Acquire after the expiry wake-up: %v", err)
	}
}

// A refresh re-arms the expiry timer: here to an earlier expiry than the
// grant's, so a wake-up at the refreshed expiry shows the re-arming.
func TestSubscribeFollowsRefresh(t *testing.T) {
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := ctxT(t)
	if _, err := a.Acquire(ctx, "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	wake := subscribe(t, b, "k")
	const ttl = 300 * time.Millisecond
	refreshed := time.Now()
	if err := a.Refresh(ctx, "k", "A", ttl); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "expiry after refresh")
	if el := time.Since(refreshed); el < ttl {
		t.Fatalf("woken %v after the refresh, before the refreshed ttl %v", el, ttl)
	}
}

func TestSubscribeCrossProcess(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	p := startHelper(t, dir, "acquire", "k") // acquires "k" for an hour and exits
	p.expect(t, "acquired")
	wake := subscribe(t, l, "k")
	noWake(t, wake, "a holder that died (its lease is still in force)")
	// Another process releases it.
	q := startHelper(t, dir, "release", "k")
	q.expect(t, "released")
	waitWake(t, wake, "release by another process")
}

// A subscription made while a stopped process holds the flock returns at
// once and wakes when the lease can be read.
func TestSubscribeUnderHeldFlock(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	p := startHelper(t, dir, "flock", "k")
	p.expect(t, "locked")
	wake := subscribe(t, l, "k")
	_ = p.cmd.Process.Kill()
	waitWake(t, wake, "the flock becoming free")
}

func TestSubscribeCloseWakes(t *testing.T) {
	l := open(t, t.TempDir())
	wake := subscribe(t, l, "k")
	l.Close()
	waitWake(t, wake, "Close")
}

func TestSubscribePollingFallback(t *testing.T) {
	noInotify = true
	t.Cleanup(func() { noInotify = false })
	dir := t.TempDir()
	a, b := open(t, dir), open(t, dir)
	ctx := context.Background()
	if _, err := a.Acquire(ctx, "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	wake := subscribe(t, b, "k")
	if err := a.Release(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "release, polling")
}

// A lock file removed by hand (or by an earlier version's release) wakes
// waiters too.
func TestSubscribeWakesOnRemoval(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	if _, err := l.Acquire(ctxT(t), "k", "A", time.Hour); err != nil {
		t.Fatal(err)
	}
	wake := subscribe(t, l, "k")
	if err := os.Remove(l.Path("k")); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "removal")
}
