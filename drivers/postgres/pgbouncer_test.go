package postgres

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker/internal/pgtest"
)

// Behind a real PgBouncer in transaction mode, session advisory locks would
// not coordinate (the next transaction may run on another server session),
// so the driver refuses with ErrPooler and leaves nothing held.
func TestBehindPgBouncerRefused(t *testing.T) {
	srv := pgtest.Start(t)
	port := srv.StartPgBouncer(t)
	ctx := ctxFor(t, 60*time.Second)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	l, err := Open(ctx, url)
	if err == nil {
		defer l.Close()
		_, err = l.Acquire(ctx, "behind-pgbouncer", "o", time.Minute)
	}
	if !errors.Is(err, ErrPooler) {
		t.Fatalf("lock through PgBouncer (transaction mode): got %v, want ErrPooler", err)
	}
	t.Logf("refused with: %v", err)
	// Nothing was left held on the server.
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d advisory locks left on the server", n)
	}
}
