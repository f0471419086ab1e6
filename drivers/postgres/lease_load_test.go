package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
)

// The default pool fits the default server: in lease mode a Locker's
// connections (pool, renewals, notifications) leave most of
// max_connections 100 (less superuser_reserved_connections 3) to others;
// advisory mode keeps its larger default, and pool_max_conns overrides
// both.
func TestLeaseDefaultPool(t *testing.T) {
	for _, c := range []struct {
		url  string
		want int32
	}{
		{"postgres://h/db?mode=lease", DefaultLeasePoolMaxConns},
		{"postgres://h/db", DefaultPoolMaxConns},
		{"postgres://h/db?mode=advisory", DefaultPoolMaxConns},
		{"postgres://h/db?mode=lease&pool_max_conns=40", 40},
	} {
		cfg, err := parseDSN(c.url)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.pool.MaxConns != c.want {
			t.Errorf("%s: pool_max_conns %d, want %d", c.url, cfg.pool.MaxConns, c.want)
		}
	}
	if per := DefaultLeasePoolMaxConns + 2; per*4 > 100-3 {
		t.Errorf("%d connections per lease-mode Locker: four Lockers do not fit max_connections 100", per)
	}
}

// "too many clients" names the cause for the mode: in lease mode the
// Locker's own use is bounded by its pool, so it never blames held locks.
func TestSlotsErrorPerMode(t *testing.T) {
	srv := pgtest.Start(t, "max_connections=3", "superuser_reserved_connections=0")
	ctx := ctxFor(t, time.Minute)
	for range 3 {
		c, err := pgx.Connect(ctx, srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(context.Background())
	}
	for _, c := range []struct{ mode, want, not string }{
		{ModeLease, "in lease mode a Locker uses at most pool_max_conns (16)", "every held lock"},
		{ModeAdvisory, "in advisory mode every held lock and every waiter", "lease mode a Locker"},
	} {
		_, err := Open(ctx, srv.URL()+"&mode="+c.mode)
		var se *SlotsError
		var pgErr *pgconn.PgError
		if !errors.As(err, &se) || se.Mode != c.mode || !errors.Is(err, driver.ErrUnavailable) ||
			!errors.As(err, &pgErr) || pgErr.Code != "53300" {
			t.Fatalf("%s: Open on a full server: %v", c.mode, err)
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, c.not) {
			t.Errorf("%s: %v", c.mode, err)
		}
	}
}

// Renewals of held locks get through while every pooled connection is
// taken and acquires queue for one: they run on the connection reserved
// for them.
func TestLeaseRenewalsWhilePoolExhausted(t *testing.T) {
	l := openLeaseT(t, serverURL(t)+"&pool_max_conns=2&namespace="+fmt.Sprint(t.Name(), time.Now().UnixNano()))
	ctx := ctxFor(t, time.Minute)
	const n = 20
	for i := range n {
		if _, err := l.Acquire(ctx, fmt.Sprint(i), "o", 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	var taken []*pgxpool.Conn
	for range 2 {
		c, err := l.lease.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, c)
	}
	// Acquires wait for a pooled connection, bounded by their context.
	actx, cancel := context.WithCancel(ctx)
	var waiting sync.WaitGroup
	for i := range 8 {
		waiting.Go(func() {
			_, err := l.Acquire(actx, fmt.Sprint("w", i), "o", time.Second)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("acquire with the pool exhausted: %v, want it to wait until cancelled", err)
			}
		})
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			defer rcancel()
			if err := l.Refresh(rctx, fmt.Sprint(i), "o", 10*time.Second); err != nil {
				t.Errorf("refresh %d with the pool exhausted: %v", i, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d renewals with the pool exhausted took %v", n, time.Since(start))
	cancel()
	waiting.Wait()
	for _, c := range taken {
		c.Release()
	}
}

// One batch, per-lock answers: of locks refreshed together, only the one
// whose row expired and the one taken by another owner are not held.
func TestLeaseRenewBatchIsolation(t *testing.T) {
	ns := fmt.Sprint(t.Name(), time.Now().UnixNano())
	l := openLeaseT(t, serverURL(t)+"&namespace="+ns)
	ctx := ctxFor(t, time.Minute)
	const n = 50
	for i := range n {
		if _, err := l.Acquire(ctx, fmt.Sprint(i), "o", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	tbl := l.lease.table
	if _, err := l.lease.pool.Exec(ctx, `UPDATE `+tbl+` SET expires_at = clock_timestamp() WHERE id = $1`, leaseID(ns, "7")); err != nil {
		t.Fatal(err)
	}
	if _, err := l.lease.pool.Exec(ctx, `UPDATE `+tbl+` SET owner = 'other' WHERE id = $1`, leaseID(ns, "31")); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = l.Refresh(ctx, fmt.Sprint(i), "o", time.Minute) })
	}
	wg.Wait()
	for i, err := range errs {
		switch {
		case i == 7 || i == 31:
			if !errors.Is(err, driver.ErrNotHeld) {
				t.Errorf("refresh %d: %v, want ErrNotHeld", i, err)
			}
		case err != nil:
			t.Errorf("refresh %d: %v", i, err)
		}
	}
}
