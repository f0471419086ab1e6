package postgres

import (
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tableStats returns the lease table's update counters once the server has
// seen at least wantUpd updates (statistics reach the server
// asynchronously).
func tableStats(t testing.TB, p *pgxpool.Pool, wantUpd int64) (upd, hot, live, dead int64) {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	for {
		err := p.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd, n_live_tup, n_dead_tup FROM pg_stat_user_tables
			WHERE relid = 'public.locker_leases'::regclass`).Scan(&upd, &hot, &live, &dead)
		if err != nil {
			t.Fatal(err)
		}
		if upd >= wantUpd {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("the server saw %d updates of the lease table, want %d", upd, wantUpd)
		}
		time.Sleep(50 * time.Millisecond) // statistics are flushed asynchronously; bounded by ctx
	}
}

// rowCount counts the lease table's rows.
func rowCount(t testing.TB, p *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := p.QueryRow(ctxFor(t, 30*time.Second), `SELECT count(*) FROM public.locker_leases`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The lease table stays small: taking over an expired row, or a released
// one, updates it in place (one row per key), and those updates are HOT
// (no index entry is added).
func TestLeaseTableReuseAndHOT(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 2*time.Minute)
	url := leaseURL(srv.URL()) + "&pool_max_conns=1"
	l := openLeaseT(t, url)
	admin := poolT(t, srv.URL())
	const keys, rounds = 20, 50
	for r := range rounds {
		for k := range keys {
			key := fmt.Sprintf("hot/%d", k)
			if _, err := l.Acquire(ctx, key, fmt.Sprintf("o%d", r), time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := l.Release(ctx, key, fmt.Sprintf("o%d", r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Expired rows, taken over by another owner.
	for k := range keys {
		if _, err := l.Acquire(ctx, fmt.Sprintf("hot/%d", k), "short", time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	for k := range keys {
		key := fmt.Sprintf("hot/%d", k)
		for {
			_, err := l.Acquire(ctx, key, "taker", time.Minute)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("taking over the expired %s: %v", key, err)
			}
		}
	}
	if n := rowCount(t, admin); n != keys {
		t.Fatalf("%d rows for %d keys", n, keys)
	}
	// Make the pool's one session report its statistics.
	if _, err := l.lease.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	if _, err := l.lease.pool.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	want := int64(keys*(2*rounds-1) + 2*keys)
	upd, hot, _, _ := tableStats(t, admin, want)
	t.Logf("%d updates, %d HOT (%.1f%%)", upd, hot, 100*float64(hot)/float64(upd))
	if float64(hot) < 0.9*float64(upd) {
		t.Fatalf("%d of %d updates HOT, want at least 90%%", hot, upd)
	}
}

// Rows left by holders that never came back are deleted by the sweeper
// once they have been expired for the sweep age, and not before (judged by
// the server's clock).
func TestLeaseSweep(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 2*time.Minute)
	p := poolT(t, srv.URL())
	const age = 500 * time.Millisecond
	sweeper, err := New(ctx, p, &Options{Mode: ModeLease, SweepInterval: 20 * time.Millisecond, SweepAge: age})
	if err != nil {
		t.Fatal(err)
	}
	defer sweeper.Close()
	crashed := openLeaseT(t, leaseURL(srv.URL()))
	if _, err := crashed.Acquire(ctx, "crashed", "gone", 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := crashed.Acquire(ctx, "live", "here", time.Minute); err != nil {
		t.Fatal(err)
	}
	crashed.Close() // never released
	var expires time.Time
	if err := p.QueryRow(ctx, `SELECT expires_at FROM public.locker_leases WHERE key = 'crashed'`).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	for {
		var exists, due bool
		err := p.QueryRow(ctx, `SELECT EXISTS (SELECT FROM public.locker_leases WHERE key = 'crashed'),
			clock_timestamp() >= $1::timestamptz + $2::bigint * interval '1 millisecond'`,
			expires, age.Milliseconds()).Scan(&exists, &due)
		if err != nil {
			t.Fatal(err)
		}
		if !exists && !due {
			t.Fatal("the row was removed before it had been expired for the sweep age")
		}
		if !exists {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the crashed holder's row was never removed")
		}
		time.Sleep(10 * time.Millisecond) // watching the sweeper; bounded by ctx
	}
	if n := rowCount(t, p); n != 1 {
		t.Fatalf("%d rows left, want the live one", n)
	}
	info, err := sweeper.Inspect(ctx, "live")
	if err != nil || info.Owner != "here" {
		t.Fatalf("the live lease: %+v %v", info, err)
	}
}
