package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestStartRestartStopCont(t *testing.T) {
	srv := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	c, err := pgconn.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (7)").ReadAll(); err != nil {
		t.Fatal(err)
	}

	// Stop: a query does not answer until Cont.
	srv.Stop(t)
	qctx, qcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = c.Exec(qctx, "SELECT 1").ReadAll()
	qcancel()
	if err == nil {
		t.Fatal("query answered by a stopped server")
	}
	srv.Cont(t)

	// Restart: the old connection is gone, data survives crash recovery.
	srv.Restart(t)
	c2, err := pgconn.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close(ctx)
	res, err := c2.Exec(ctx, "SELECT x FROM t").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Rows[0][0]); got != "7" {
		t.Fatalf("after restart x = %q, want 7", got)
	}
	if srv.Log() == "" {
		t.Error("Log is empty")
	}
}

func TestStandby(t *testing.T) {
	srv := Start(t)
	st := srv.StartStandby(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgconn.Connect(ctx, st.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	res, err := c.Exec(ctx, "SELECT pg_is_in_recovery()").ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res[0].Rows[0][0]); got != "t" {
		t.Fatalf("standby pg_is_in_recovery() = %q", got)
	}
}
