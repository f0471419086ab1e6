package postgres

import (
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A connection holding a lock never goes back to the pool (advisory locks
// are re-entrant per session: the next borrower would "hold" it too), and a
// connection goes back clean after release.
func TestPinnedConnection(t *testing.T) {
	url := serverURL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 3
	ctx := ctxFor(t, 60*time.Second)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var appBefore, istBefore string
	if err := p.QueryRow(ctx, `SELECT current_setting('application_name'), current_setting('idle_session_timeout')`).Scan(&appBefore, &istBefore); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, p, &Options{Namespace: "pinned"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	key := "pinned/" + time.Now().Format(time.RFC3339Nano)
	if _, err := l.Acquire(ctx, key, "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	adv := AdvisoryKey("pinned", key)
	holder := holderPID(t, p, "pinned", key)
	// Every connection the pool can still hand out.
	var conns []*pgxpool.Conn
	for range cfg.MaxConns - 1 {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var pid int
		var got bool
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid(), pg_try_advisory_lock($1)`, adv).Scan(&pid, &got); err != nil {
			t.Fatal(err)
		}
		if pid == holder || got {
			t.Fatalf("the pool handed out the holder's session (pid %d, got lock %v)", pid, got)
		}
	}
	for _, c := range conns {
		c.Release()
	}
	if err := l.Release(ctx, key, "o"); err != nil {
		t.Fatal(err)
	}
	// Now the holder's connection is back, clean.
	all := p.AcquireAllIdle(ctx)
	found := false
	for _, c := range all {
		var pid, locks int
		var app, ist string
		if err := c.QueryRow(ctx, `SELECT pg_backend_pid(), (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'),
			current_setting('application_name'), current_setting('idle_session_timeout')`).Scan(&pid, &locks, &app, &ist); err != nil {
			t.Fatal(err)
		}
		found = found || pid == holder
		if locks != 0 || app != appBefore || ist != istBefore {
			t.Errorf("pooled session %d after release: %d advisory locks, application_name %q, idle_session_timeout %q", pid, locks, app, ist)
		}
		c.Release()
	}
	if !found {
		t.Error("the holder's connection did not go back to the pool after release")
	}
}

// Behind a pooler the backend pid differs from the handshake's: the acquire
// statement then takes no lock at all.
func TestPoolerDetected(t *testing.T) {
	l := openT(t, serverURL(t))
	ctx := ctxFor(t, 30*time.Second)
	c, err := l.adv.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	adv := AdvisoryKey(l.adv.ns, "pooler")
	var ok *bool
	var locks int
	err = c.QueryRow(ctx, `SELECT ok, (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory')
		FROM (`+l.adv.sql.acquire[0][0]+`) q(ok)`, adv, int64(c.Conn().PgConn().PID())+1, "1000", "3e8", "o").Scan(&ok, &locks)
	if err != nil {
		t.Fatal(err)
	}
	if ok != nil || locks != 0 {
		t.Fatalf("with a mismatched pid: ok=%v, %d locks held", ok, locks)
	}
}

// Refresh and Release through a Locker other than the holder's, or by an
// owner that does not hold the key, change nothing.
func TestOwnershipIsPerSession(t *testing.T) {
	url := serverURL(t)
	a, b := openT(t, url), openT(t, url)
	ctx := ctxFor(t, 30*time.Second)
	key := "owner/" + time.Now().Format(time.RFC3339Nano)
	tok, err := a.Acquire(ctx, key, "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Refresh(ctx, key, "o", time.Minute); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Refresh through another Locker: %v", err)
	}
	if err := b.Release(ctx, key, "o"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release through another Locker: %v", err)
	}
	if err := a.Release(ctx, key, "x"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release by another owner: %v", err)
	}
	var held *driver.HeldError
	if _, err := b.Acquire(ctx, key, "p", time.Minute); !errors.As(err, &held) || errors.Is(err, driver.ErrUnavailable) ||
		held.Remaining <= 0 || held.Remaining > time.Minute {
		t.Fatalf("Acquire of a held key: %v, want a HeldError with the remaining TTL", err)
	}
	tok2, err := a.Acquire(ctx, key, "o", time.Minute)
	if err != nil || tok2 != tok {
		t.Fatalf("idempotent Acquire: %d %v, want %d", tok2, err, tok)
	}
	if err := a.Release(ctx, key, "o"); err != nil {
		t.Fatal(err)
	}
}
