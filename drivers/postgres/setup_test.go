package postgres

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5/pgconn"
)

// Wrong password and missing database: Open fails with the server's reason.
func TestOpenAuthAndDatabase(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 60*time.Second)
	p := poolT(t, srv.URL())
	if _, err := p.Exec(ctx, `CREATE ROLE alice LOGIN PASSWORD 'right'`); err != nil {
		t.Fatal(err)
	}
	hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(srv.DataDir(), "pg_hba.conf"), []byte(hba), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	base := fmt.Sprintf("postgres://alice:%%s@%s/postgres?sslmode=disable", srv.Addr())
	// The reload is asynchronous: wait until the right password is needed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := Open(ctx, fmt.Sprintf(base, "wrong"))
		if err != nil && strings.Contains(err.Error(), "password authentication failed") {
			break
		}
		if err == nil {
			l.Close() // pg_hba.conf not reloaded yet
		}
		if time.Now().After(deadline) {
			t.Fatalf("wrong password: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for the server to reload pg_hba.conf
	}
	// An authentication failure is "cannot reach the backend", not "held".
	wrong := fmt.Sprintf(base, "wrong")
	for _, open := range []func() error{
		func() error { _, err := Open(ctx, wrong); return err },
		func() error { _, err := locker.OpenURL(wrong); return err },
	} {
		if err := open(); !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("wrong password: %v, want ErrUnavailable", err)
		}
	}
	if _, err := Open(ctx, fmt.Sprintf("postgres://postgres@%s/nosuchdb?sslmode=disable", srv.Addr())); err == nil ||
		!strings.Contains(err.Error(), `database "nosuchdb" does not exist`) {
		t.Fatalf("missing database: %v", err)
	}
	// alice may not create in public (PostgreSQL 15): an administrator
	// creates the sequence once, then alice can use it.
	if _, err := Open(ctx, fmt.Sprintf(base, "right")+"&schema=alice_locks"); err == nil ||
		!strings.Contains(err.Error(), "permission denied") {
		t.Fatalf("Open without CREATE privilege: %v", err)
	}
	if _, err := p.Exec(ctx, `CREATE SCHEMA alice_locks; CREATE SEQUENCE alice_locks.locker_token_seq;
		GRANT USAGE ON SCHEMA alice_locks TO alice; GRANT USAGE ON SEQUENCE alice_locks.locker_token_seq TO alice`); err != nil {
		t.Fatal(err)
	}
	l := openT(t, fmt.Sprintf(base, "right")+"&schema=alice_locks")
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
}

// A read-only standby is refused: advisory locks there do not coordinate
// with the primary.
func TestStandbyRefused(t *testing.T) {
	srv := pgtest.Start(t)
	openT(t, srv.URL()).Close() // the sequence exists on the primary, and so on the standby
	st := srv.StartStandby(t)
	_, err := Open(ctxFor(t, 60*time.Second), st.URL())
	if !errors.Is(err, ErrStandby) {
		t.Fatalf("Open on a standby: %v, want ErrStandby", err)
	}
	if n := advisoryLocks(t, st.URL()); n != 0 {
		t.Fatalf("%d advisory locks left on the standby", n)
	}
}

// Past the server's max_connections, Acquire fails at once with a clear
// error and leaves nothing held; the other locks are unaffected.
func TestTooManyConnections(t *testing.T) {
	srv := pgtest.Start(t, "max_connections=8", "superuser_reserved_connections=0")
	l := openT(t, srv.URL())
	ctx := ctxFor(t, 60*time.Second)
	var held []string
	var err error
	for i := range 20 {
		key := fmt.Sprintf("k%d", i)
		if _, err = l.Acquire(ctx, key, "o", time.Minute); err != nil {
			break
		}
		held = append(held, key)
	}
	if err == nil {
		t.Fatal("20 locks on a server with max_connections=8")
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "53300" || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("Acquire past max_connections: %v", err)
	}
	t.Logf("held %d locks; then: %v", len(held), err)
	if ctx.Err() != nil {
		t.Fatal("Acquire waited for its context instead of failing")
	}
	if len(held) == 0 {
		t.Fatal("no lock at all")
	}
	// Release one lock and look through its connection, back in the pool.
	if err := l.Release(ctx, held[0], "o"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := l.adv.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(held)-1 {
		t.Fatalf("%d advisory locks on the server, want %d", n, len(held)-1)
	}
	for _, k := range held[1:] {
		if err := l.Release(ctx, k, "o"); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.adv.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d advisory locks left (%v)", n, err)
	}
}

// advisoryLocks counts the advisory locks granted on the server at url.
func advisoryLocks(t *testing.T, url string) int {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	c, err := pgconn.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	res, err := c.Exec(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(string(res[0].Rows[0][0]), &n)
	return n
}
