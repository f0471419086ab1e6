package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/contendtest"
	"github.com/go-locker/locker/internal/pgtest"
)

// BenchmarkContention: in each mode, 8, 32 and 64 Lockers (separate
// pools, as separate processes) contend for a mutex (mutex-N) and for the
// permits of a semaphore of 4 (sem4-N), on a private server; see
// contendtest.Bench. calls/acq counts the statements the clients sent
// (pg_stat_statements, top level), less the session probes and the
// benchmark's own queries. Run with a fixed count, e.g. -benchtime 400x.
func BenchmarkContention(b *testing.B) {
	srv := pgtest.Start(b, "shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=top", "max_connections=500")
	ctx := context.Background()
	mon, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		b.Fatal(err)
	}
	defer mon.Close(ctx)
	if _, err := mon.Exec(ctx, `CREATE EXTENSION pg_stat_statements`); err != nil {
		b.Fatal(err)
	}
	calls := func() int64 {
		var n int64
		if err := mon.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_statements
			WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pid = ANY($1)%'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		url := srv.URL()
		if mode == ModeLease {
			url = leaseURL(url)
		}
		contendtest.Bench(b, mode+"-", func(b *testing.B, procs int) []*locker.Locker {
			ls := make([]*locker.Locker, procs)
			for i := range ls {
				ls[i] = locker.New(openT(b, url))
			}
			return ls
		}, calls)
	}
}
