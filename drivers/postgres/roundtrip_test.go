package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// What the server sees per operation, counted by pg_stat_statements (every
// statement executed) and transaction ids (a commit flushes the WAL only if
// its transaction has one): an uncontended acquire+release is two
// statements, a refresh one, holding a watched lock none on the lock's
// session (the session probe's one statement per probeInterval, for all the
// Locker's watched locks, is counted apart), a refused attempt two, and a
// WAL flush happens about once per 32 acquisitions (when the sequence
// logs), not on every one.
func TestStatementsPerOperation(t *testing.T) {
	srv := pgtest.Start(t, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all")
	ctx := ctxFor(t, 2*time.Minute)
	mon, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close(ctx)
	if _, err := mon.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	d := openT(t, srv.URL())
	l := locker.New(d)
	defer l.Close()
	// Warm up: a pooled connection with its prepared statements.
	lk, err := l.TryAcquire(ctx, "warm", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The probe's statement is told apart by its text.
	count := func(probe bool) int64 {
		var n int64
		if err := mon.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
			WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_current_snapshot%'
				AND (query LIKE '%pid = ANY($1)%') = $1`, probe).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	statements := func() int64 { return count(false) }
	// Transaction ids assigned: a statement flushes the WAL at commit only
	// if it has one (its nextval logged, or it emitted a message to flush
	// another's record).
	xids := func() int64 {
		var n int64
		if err := mon.QueryRow(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	reset := func() {
		if _, err := mon.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
			t.Fatal(err)
		}
	}

	const n = 320
	reset()
	xid0 := xids()
	for range n {
		lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got, flushes := statements(), xids()-xid0
	t.Logf("%d acquire+release: %d statements, %d WAL flushes", n, got, flushes)
	if got != 2*n {
		t.Errorf("%d acquire+release ran %d statements, want %d (one each)", n, got, 2*n)
	}
	if flushes > n/32+3 {
		t.Errorf("%d acquire+release flushed the WAL %d times, want about %d (once per 32 tokens)", n, flushes, n/32)
	}

	// A refused attempt is two statements: the try, and the look-up of
	// the holder's remaining TTL.
	other := locker.New(openT(t, srv.URL()))
	defer other.Close()
	held, err := other.TryAcquire(ctx, "k", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	reset()
	if _, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute)); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key: %v", err)
	}
	if got := statements(); got != 2 {
		t.Errorf("a refused TryAcquire ran %d statements, want 2", got)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// Holding a watched lock sends nothing; a refresh is one statement.
	lk, err = l.TryAcquire(ctx, "held", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	reset()
	time.Sleep(time.Second) // the interval during which nothing may be sent
	if got := statements(); got != 0 {
		t.Errorf("holding a lock for 1s ran %d statements, want 0", got)
	}
	probes := count(true)
	t.Logf("holding a watched lock for 1s: %d probe statements", probes)
	if probes < 1 || probes > int64(time.Second/probeInterval)+2 {
		t.Errorf("holding a watched lock for 1s ran %d probe statements, want 1 to %d", probes, time.Second/probeInterval+2)
	}
	if err := lk.Refresh(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := statements(); got != 1 {
		t.Errorf("a refresh ran %d statements, want 1", got)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
