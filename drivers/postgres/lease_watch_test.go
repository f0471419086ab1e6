package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
)

// waitWake waits for a wake-up on ch, failing after d.
func waitWake(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: no wake-up within %v", what, d)
	}
}

// noWake checks that ch has no wake-up pending.
func noWake(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatalf("%s: unexpected wake-up", what)
	default:
	}
}

// listeners counts the server sessions LISTENing for releases.
func listeners(t *testing.T, url string) int { return listenersOn(t, url, leaseChannel) }

// listenersOn counts the server sessions whose last statement was LISTEN
// channel.
func listenersOn(t *testing.T, url, channel string) int {
	t.Helper()
	var n int
	err := poolT(t, url).QueryRow(ctxFor(t, 30*time.Second),
		`SELECT count(*) FROM pg_stat_activity WHERE query = 'LISTEN `+channel+`'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// One listener connection per Locker serves every waiting key; a release
// wakes the subscribers of its key only. When the listener's backend is
// terminated, every subscriber is woken once after it reconnects, and
// releases wake them again.
func TestLeaseListener(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 2*time.Minute)
	url := leaseURL(srv.URL()) + "&pool_max_conns=4"
	w, h := openLeaseT(t, url), openLeaseT(t, url)
	const keys = 50
	wakes := make([]<-chan struct{}, keys)
	for i := range keys {
		key := fmt.Sprintf("listen/%d", i)
		if _, err := h.Acquire(ctx, key, "h", time.Minute); err != nil {
			t.Fatal(err)
		}
		ch, cancel, err := w.lease.subscribe(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		defer cancel()
		wakes[i] = ch
	}
	if n := listeners(t, srv.URL()); n != 1 {
		t.Fatalf("%d listener sessions for %d waiting keys, want 1", n, keys)
	}
	if err := h.Release(ctx, "listen/7", "h"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wakes[7], 10*time.Second, "release of listen/7")
	for i, ch := range wakes {
		noWake(t, ch, fmt.Sprintf("listen/%d after the release of listen/7", i))
	}

	// Terminate the listener's backend.
	p := poolT(t, srv.URL())
	var killed int
	if err := p.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = 'LISTEN `+leaseChannel+`'`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners (%v)", killed, err)
	}
	for i, ch := range wakes {
		waitWake(t, ch, 10*time.Second, fmt.Sprintf("listen/%d after the listener was terminated", i))
	}
	deadline := time.Now().Add(10 * time.Second)
	for listeners(t, srv.URL()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not reconnect")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's view, bounded by deadline
	}
	if err := h.Release(ctx, "listen/9", "h"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wakes[9], 10*time.Second, "release of listen/9 after reconnecting")
	noWake(t, wakes[8], "listen/8 after the release of listen/9")
}
