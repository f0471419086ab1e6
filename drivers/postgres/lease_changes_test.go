package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/pgtest"
)

// changeListeners counts the server sessions LISTENing for grants.
func changeListeners(t *testing.T, url string) int { return listenersOn(t, url, leaseGrantChannel) }

// TestLeaseWatchChanges: in lease mode a Locker watching an election key's changes
// hears, through its own listener connection, each grant made through
// another Locker (a first grant, a grant after a release, a takeover of an
// expired lease) and each release; one listener serves every watch; after
// its backend is terminated it reconnects and reports a change once, and
// later grants are heard again. A plain lock's key (whose grants are not
// announced), and every key in advisory mode, are unsupported.
func TestLeaseWatchChanges(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	url := leaseURL(srv.URL()) + "&pool_max_conns=4"
	w, h := openLeaseT(t, url), openLeaseT(t, url)
	key := locker.ElectionPrefix + "changes"
	ch := make(chan struct{}, 1)
	changed := func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	stop, err := w.WatchChanges(ctx, key, changed)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	other := make(chan struct{}, 1)
	stop2, err := w.WatchChanges(ctx, locker.ElectionPrefix+"changes/other", func() {
		select {
		case other <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop2()
	if n := changeListeners(t, srv.URL()); n != 1 {
		t.Fatalf("%d grant listener sessions for 2 watches, want 1", n)
	}
	const d = 10 * time.Second
	if _, err := h.Acquire(ctx, key, "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, d, "grant")
	if err := h.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, d, "release")
	if _, err := h.Acquire(ctx, key, "b", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, d, "grant after a release")
	deadline := time.Now().Add(d)
	for {
		if _, err := h.Acquire(ctx, key, "c", time.Minute); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 50ms lease was not taken over")
		}
		time.Sleep(10 * time.Millisecond) // waiting for the server-side expiry, bounded
	}
	waitWake(t, ch, d, "takeover of an expired lease")
	noWake(t, other, "changes/other, whose key never changed")

	var killed int
	if err := poolT(t, srv.URL()).QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query = 'LISTEN `+leaseGrantChannel+`'`).Scan(&killed); err != nil || killed != 1 {
		t.Fatalf("terminated %d listeners (%v)", killed, err)
	}
	waitWake(t, ch, d, "reconnect of the listener")
	waitWake(t, other, d, "reconnect of the listener (changes/other)")
	deadline = time.Now().Add(d)
	for changeListeners(t, srv.URL()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the listener did not reconnect")
		}
		time.Sleep(10 * time.Millisecond) // polling the server's view, bounded by deadline
	}
	if err := h.Release(ctx, key, "c"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, d, "release after reconnecting")
	if _, err := h.Acquire(ctx, key, "d", time.Minute); err != nil {
		t.Fatal(err)
	}
	waitWake(t, ch, d, "grant after reconnecting")

	if _, err := w.WatchChanges(ctx, "plain", changed); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("lease mode WatchChanges of a plain lock's key: %v, want errors.ErrUnsupported", err)
	}
	adv := openT(t, srv.URL())
	if _, err := adv.WatchChanges(ctx, key, changed); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("advisory mode WatchChanges: %v, want errors.ErrUnsupported", err)
	}
}
