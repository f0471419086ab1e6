package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// The mode parameter: lease or advisory, nothing else; Open and Driver.Open
// return a *Locker in the mode the URL names, and unknown parameters are
// still rejected.
func TestLeaseModeParam(t *testing.T) {
	for _, dsn := range []string{
		"postgres://h/db?mode=nonsense",
		"postgres://h/db?mode=",
		"postgres://h/db?mode=Lease",
		"postgres://h/db?mode=lease&mode=lease",
		"postgres://h/db?mode=lease&bogus=1",
	} {
		if _, err := parseDSN(dsn); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("parseDSN(%q) = %v, want ErrInvalid", dsn, err)
		}
		if _, err := locker.OpenURL(dsn); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("locker.OpenURL(%q) = %v, want ErrInvalid", dsn, err)
		}
	}
	c, err := parseDSN("postgres://h/db")
	if err != nil || c.mode != ModeAdvisory {
		t.Fatalf("default mode: %+v %v", c, err)
	}
	url := serverURL(t)
	d, err := Driver{}.Open(leaseURL(url))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if l, ok := d.(*Locker); !ok || l.Mode() != ModeLease {
		t.Fatalf("Driver.Open with mode=lease returned %T", d)
	}
	if d.(driver.Capable).Capabilities().LockerBound {
		t.Fatal("lease mode declares LockerBound")
	}
	a, err := Driver{}.Open(url + "&mode=advisory")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if l, ok := a.(*Locker); !ok || l.Mode() != ModeAdvisory {
		t.Fatalf("Driver.Open with mode=advisory returned %T", a)
	}
}

// Lockers opened at once on a fresh schema all succeed: the creation of
// the schema, the sequence and the lease table is serialized.
func TestLeaseSetupConcurrent(t *testing.T) {
	url := serverURL(t)
	schema := fmt.Sprintf("lease_setup_%d", time.Now().UnixNano())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := Open(ctxFor(t, time.Minute), leaseURL(url)+"&schema="+schema)
			if err == nil {
				l.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A role without CREATE on the schema gets an error naming the DDL to run;
// once an administrator ran it (and granted use), the role works. A lease
// table of the wrong shape is refused with the shape wanted, and Open
// changes nothing.
func TestLeaseSetupPrivilegeAndShape(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 2*time.Minute)
	admin := poolT(t, srv.URL())
	if _, err := admin.Exec(ctx, `CREATE ROLE alice LOGIN; CREATE SCHEMA alice_locks`); err != nil {
		t.Fatal(err)
	}
	alice := fmt.Sprintf("postgres://alice@%s/postgres?sslmode=disable&mode=lease&schema=alice_locks", srv.Addr())
	_, err := Open(ctx, leaseURL(alice))
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Open in lease mode without CREATE: %v", err)
	}
	_, ddl, ok := strings.Cut(err.Error(), "run: ")
	if !ok || !strings.Contains(ddl, "CREATE TABLE IF NOT EXISTS "+`"alice_locks"."locker_leases"`) ||
		!strings.Contains(ddl, "CREATE SEQUENCE IF NOT EXISTS") ||
		!strings.Contains(ddl, `GRANT SELECT, INSERT, UPDATE, DELETE ON "alice_locks"."locker_leases" TO "alice"`) {
		t.Fatalf("error does not name the DDL: %v", err)
	}
	t.Logf("without CREATE: %v", err)
	var n int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = 'alice_locks'::regnamespace`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d objects left in the schema (%v)", n, err)
	}
	if _, err := admin.Exec(ctx, ddl); err != nil {
		t.Fatalf("running the DDL from the error: %v", err)
	}
	// Revoked rights on the table are named too.
	if _, err := admin.Exec(ctx, `REVOKE DELETE ON alice_locks.locker_leases FROM alice`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, leaseURL(alice)); err == nil || !strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE, DELETE") {
		t.Fatalf("Open in lease mode without DELETE on the table: %v", err)
	}
	if _, err := admin.Exec(ctx, `GRANT DELETE ON alice_locks.locker_leases TO alice`); err != nil {
		t.Fatal(err)
	}
	l := openLeaseT(t, alice)
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}

	// Wrong shapes: a missing column, a wrong type, a wrong primary key.
	for i, ddl := range []string{
		`CREATE TABLE %s.locker_leases (id bytea PRIMARY KEY, key bytea, owner bytea, token bigint, expires_at timestamptz)`,
		`CREATE TABLE %s.locker_leases (id bytea PRIMARY KEY, key text, owner bytea, token bigint, expires_at timestamptz, ttl_ms bigint)`,
		`CREATE TABLE %s.locker_leases (id bytea, key bytea PRIMARY KEY, owner bytea, token bigint, expires_at timestamptz, ttl_ms bigint)`,
	} {
		schema := fmt.Sprintf("shape%d", i)
		if _, err := admin.Exec(ctx, `CREATE SCHEMA `+schema+`; `+fmt.Sprintf(ddl, schema)); err != nil {
			t.Fatal(err)
		}
		_, err := Open(ctx, leaseURL(srv.URL())+"&schema="+schema)
		if err == nil || !strings.Contains(err.Error(), "wrong shape") || !strings.Contains(err.Error(), "CREATE TABLE IF NOT EXISTS") {
			t.Fatalf("wrong shape %d: %v", i, err)
		}
		if i == 0 {
			t.Logf("wrong shape: %v", err)
		}
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.locker_leases`).Scan(&n); err != nil || n != 0 {
			t.Fatalf("%d rows left (%v)", n, err)
		}
	}
}

// Inspect reports the live holder by the server's clock; released and
// expired keys are free. Any byte string is a key and an owner.
func TestLeaseInspect(t *testing.T) {
	url := leaseURL(serverURL(t))
	a, b := openLeaseT(t, url), openLeaseT(t, url)
	ctx := ctxFor(t, 30*time.Second)
	key := "inspect/\x00\xff/" + time.Now().Format(time.RFC3339Nano)
	owner := "own\x00er\xfe" + strings.Repeat("ø", 40)
	if _, err := b.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v", err)
	}
	if _, err := b.Inspect(ctx, ""); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Inspect of an empty key: %v", err)
	}
	tok, err := a.Acquire(ctx, key, owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	info, err := b.Inspect(ctx, key)
	if err != nil || info.Owner != owner || info.Token != tok || info.Remaining <= 50*time.Second || info.Remaining > time.Minute {
		t.Fatalf("Inspect: %+v %v", info, err)
	}
	// The same owner through the other Locker is the holder.
	if err := b.Release(ctx, key, owner); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect after release: %v", err)
	}
}

// A crash of the server (SIGKILL of every process, or an immediate
// shutdown) while a lease is held, on a server that commits asynchronously
// with the WAL writer asleep: the lease is still there after the restart
// (no one else is granted before it expires, and its holder refreshes it),
// and tokens keep increasing.
func TestLeaseSurvivesCrash(t *testing.T) {
	srv := pgtest.Start(t, "synchronous_commit=off", "wal_writer_delay=10s")
	ctx := ctxFor(t, 5*time.Minute)
	url := leaseURL(srv.URL())
	holder, other := openLeaseT(t, url), openLeaseT(t, url)
	const ttl = 2 * time.Minute
	var last uint64
	for round, crash := range []func(testing.TB){srv.Kill, srv.StopImmediate} {
		key := fmt.Sprintf("crash/%d", round)
		tok, err := holder.Acquire(ctx, key, "holder", ttl)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("round %d: token %d not above %d", round, tok, last)
		}
		last = tok
		crash(t)
		srv.Restart(t)
		_, err = other.Acquire(ctx, key, "other", ttl)
		var held *driver.HeldError
		if !errors.As(err, &held) || held.Remaining < ttl-time.Minute {
			t.Fatalf("round %d: Acquire by another owner after the crash: %v, want held for about %v", round, err, ttl)
		}
		if err := holder.Refresh(ctx, key, "holder", ttl); err != nil {
			t.Fatalf("round %d: the holder's refresh after the crash: %v", round, err)
		}
		if got, err := holder.Acquire(ctx, key, "holder", ttl); err != nil || got != tok {
			t.Fatalf("round %d: idempotent acquire after the crash: %d %v, want %d", round, got, err, tok)
		}
		if err := holder.Release(ctx, key, "holder"); err != nil {
			t.Fatal(err)
		}
		tok, err = other.Acquire(ctx, key, "other", ttl)
		if err != nil || tok <= last {
			t.Fatalf("round %d: acquire after release: %d %v, want a token above %d", round, tok, err, last)
		}
		last = tok
	}
	// After a crash the first nextval logs the sequence; its grant is
	// durable too.
	srv.Restart(t)
	tok, err := other.Acquire(ctx, "crash/final", "o", ttl)
	if err != nil || tok <= last {
		t.Fatalf("final: %d %v", tok, err)
	}
	last = tok
	srv.Restart(t)
	if tok, err := other.Acquire(ctx, "crash/after", "o", ttl); err != nil || tok <= last {
		t.Fatalf("after the last crash: %d %v, want above %d", tok, err, last)
	}
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM public.locker_leases WHERE key = 'crash/final' AND expires_at > clock_timestamp()`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the grant made just before the crash is gone: %d %v", n, err)
	}
}

// Lease mode runs one statement per operation: acquire, refresh, release,
// and a refused acquire (which also reports the holder's remaining TTL),
// counted with pg_stat_statements.
func TestLeaseStatementsPerOperation(t *testing.T) {
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
	url := leaseURL(srv.URL())
	l := locker.New(openLeaseT(t, url))
	defer l.Close()
	other := openLeaseT(t, url)
	statements := func() int64 {
		var n int64
		if err := mon.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
			WHERE query NOT LIKE '%pg_stat_statements%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	reset := func() {
		if _, err := mon.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
			t.Fatal(err)
		}
	}
	const n = 100
	reset()
	for range n {
		lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Refresh(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		var held *driver.HeldError
		if _, err := other.Acquire(ctx, "k", "other", time.Minute); !errors.As(err, &held) || held.Remaining <= 0 {
			t.Fatalf("refused acquire: %v", err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := statements(); got != 4*n {
		t.Fatalf("%d rounds of acquire, refresh, refused acquire and release ran %d statements, want %d", n, got, 4*n)
	}
}

// One Locker type, two modes, each with the optional interfaces' behaviour
// of its own: in lease mode WatchHold is unsupported (ErrClosed after
// Close) and AcquireWait is woken by the release's notification, well
// before its 2s fallback; in advisory mode the lock is LockerBound and
// watched.
func TestLockerModes(t *testing.T) {
	url := serverURL(t)
	ctx := ctxFor(t, time.Minute)
	adv, lease := openT(t, url), openLeaseT(t, url)
	if adv.Mode() != ModeAdvisory || lease.Mode() != ModeLease {
		t.Fatalf("modes %q and %q", adv.Mode(), lease.Mode())
	}
	if !adv.Capabilities().LockerBound || lease.Capabilities().LockerBound {
		t.Fatal("LockerBound must hold in advisory mode only")
	}
	key := fmt.Sprintf("modes/%d", time.Now().UnixNano())
	tok, err := adv.Acquire(ctx, key, "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := adv.WatchHold(key, "o", tok, func(error) { t.Error("advisory lock reported lost") })
	if err != nil {
		t.Fatalf("advisory WatchHold: %v", err)
	}
	stop()
	if err := adv.Release(ctx, key, "o"); err != nil {
		t.Fatal(err)
	}

	tok, err = lease.Acquire(ctx, key, "a", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lease.WatchHold(key, "a", tok, func(error) {}); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("lease WatchHold: %v, want ErrUnsupported", err)
	}
	other := openLeaseT(t, url)
	type result struct {
		tok uint64
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		tok, err := other.AcquireWait(ctx, key, "b", time.Minute)
		got <- result{tok, time.Now(), err}
	}()
	// The waiter has subscribed once its first attempt was refused; give
	// it a moment past that (a wake-up before the release only makes it
	// try again).
	time.Sleep(300 * time.Millisecond)
	released := time.Now()
	if err := lease.Release(ctx, key, "a"); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil || r.tok <= tok {
		t.Fatalf("lease AcquireWait = (%d, %v), want a token above %d", r.tok, r.err, tok)
	}
	lag := r.at.Sub(released)
	t.Logf("lease AcquireWait granted %v after the release", lag)
	if lag > 500*time.Millisecond {
		t.Errorf("lease AcquireWait granted %v after the release, want well within the 2s fallback", lag)
	}
	if err := other.Release(ctx, key, "b"); err != nil {
		t.Fatal(err)
	}
	_ = lease.Close()
	if _, err := lease.WatchHold(key, "a", tok, func(error) {}); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("lease WatchHold after Close: %v, want ErrClosed", err)
	}
}
