package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// Tokens stay durable on a server that commits asynchronously
// (synchronous_commit=off, the WAL writer asleep for 10s): a crash
// (SIGKILL of every server process, which loses the WAL still in shared
// buffers) never makes a token repeat.
//
//   - logged: the acquire's own nextval wrote the sequence's WAL record
//     (the first nextval after a restart always does); the acquire commits
//     with a flush.
//   - covered: the acquire's nextval did not log, and the record that covers
//     its value was written by another session's transaction that has not
//     committed (so not flushed); the acquire flushes it.
func TestTokensDurableAcrossCrash(t *testing.T) {
	srv := pgtest.Start(t, "synchronous_commit=off", "wal_writer_delay=10s")
	ctx := ctxFor(t, 5*time.Minute)
	seqLogCnt := func(c *pgx.Conn) int {
		var n int
		if err := c.QueryRow(ctx, `SELECT log_cnt FROM public.`+SequenceName).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var last uint64
	acquire := func(what string) uint64 {
		t.Helper()
		l := openT(t, srv.URL())
		defer l.Close()
		tok, err := l.Acquire(ctx, "k-"+what, "o", time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if tok <= last {
			t.Fatalf("%s: token %d after a crash, not above %d", what, tok, last)
		}
		last = tok
		return tok
	}
	for round := range 3 {
		// After a restart the next nextval logs: the acquire's own.
		acquire("logged")
		srv.Restart(t)

		// Another session's open transaction takes the logging nextval;
		// ours is covered by its unflushed record.
		x, err := pgx.Connect(ctx, srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		tx, err := x.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var xtok uint64
		if err := tx.QueryRow(ctx, `SELECT nextval('public.`+SequenceName+`')`).Scan(&xtok); err != nil {
			t.Fatal(err)
		}
		if xtok <= last {
			t.Fatalf("round %d: raw nextval %d not above %d", round, xtok, last)
		}
		last = xtok
		before := seqLogCnt(x)
		tok := acquire("covered")
		if after := seqLogCnt(x); after != before-1 {
			t.Fatalf("round %d: the acquire's nextval logged (log_cnt %d → %d): the test did not set up the covered case", round, before, after)
		}
		t.Logf("round %d: covered token %d", round, tok)
		srv.Restart(t)
		_ = x.Close(context.Background())
	}
	acquire("final")
}
