package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// Uncontended acquire+release of one key, side by side:
//
//	driver       this driver's Acquire + Release (2 round trips)
//	locker       package locker on this driver (TryAcquire + Release)
//	raw-session  pg_advisory_lock + pg_advisory_unlock on a pinned connection
//	raw-xact     BEGIN; pg_advisory_xact_lock; COMMIT on a pinned connection
func BenchmarkUncontended(b *testing.B) {
	url := serverURL(b)
	ctx := context.Background()
	key := fmt.Sprintf("bench/uncontended/%d", time.Now().UnixNano())

	b.Run("driver", func(b *testing.B) {
		d := openT(b, url)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.Acquire(ctx, key, "owner", 10*time.Second); err != nil {
				b.Fatal(err)
			}
			if err := d.Release(ctx, key, "owner"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("locker", func(b *testing.B) {
		l := locker.New(openT(b, url))
		defer l.Close()
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, key, locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	adv := AdvisoryKey(DefaultNamespace, key)
	b.Run("raw-session", func(b *testing.B) {
		conn := rawConn(b, url)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, adv); err != nil {
				b.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("raw-xact", func(b *testing.B) {
		conn := rawConn(b, url)
		b.ReportAllocs()
		for b.Loop() {
			tx, err := conn.Begin(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, adv); err != nil {
				b.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Uncontended acquire+release measured interleaved with its floor: each
// iteration runs the operation once on each side, in turn, and times each
// on its own, so load from other processes falls on both alike. Reported:
// ns per acquire+release of each and their ratio.
//
//	driver       this driver's Acquire + Release (2 statements)
//	locker       package locker on this driver: TryAcquire + Release
//	floor        pg_advisory_lock + pg_advisory_unlock on a pinned connection
func BenchmarkUncontendedInterleaved(b *testing.B) {
	url := serverURL(b)
	ctx := context.Background()
	key := fmt.Sprintf("bench/interleaved/%d", time.Now().UnixNano())
	d := openT(b, url)
	l := locker.New(openT(b, url))
	defer l.Close()
	conn := rawConn(b, url)
	adv := AdvisoryKey("bench-floor", key)
	var tDriver, tLocker, tFloor time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := d.Acquire(ctx, key, "owner", 10*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, key, "owner"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, adv); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tDriver += t1.Sub(t0)
		tFloor += t2.Sub(t1)
		tLocker += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(tDriver.Nanoseconds())/n, "driver-ns/op")
	b.ReportMetric(float64(tLocker.Nanoseconds())/n, "locker-ns/op")
	b.ReportMetric(float64(tFloor.Nanoseconds())/n, "floor-ns/op")
	b.ReportMetric(float64(tDriver)/float64(tFloor), "driver/floor")
	b.ReportMetric(float64(tLocker)/float64(tFloor), "locker/floor")
}

func rawConn(b *testing.B, url string) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// Handoff under contention: 8 workers (each its own Locker, as separate
// processes would be) take one key in turn and hold it 5ms. ns/op is the
// time per grant: 5ms of holding plus the handoff. Side by side with the
// same loop on raw pg_advisory_lock / pg_advisory_unlock.
func BenchmarkHandoff(b *testing.B) {
	const workers, hold = 8, 5 * time.Millisecond
	url := serverURL(b)
	ctx := context.Background()

	run := func(b *testing.B, step func(w int) error) {
		var n atomic.Int64
		n.Store(int64(b.N))
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		b.ResetTimer()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n.Add(-1) >= 0 {
					if err := step(w); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}

	b.Run("locker", func(b *testing.B) {
		key := fmt.Sprintf("bench/handoff/%d", time.Now().UnixNano())
		ls := make([]*locker.Locker, workers)
		for i := range ls {
			ls[i] = locker.New(openT(b, url))
			defer ls[i].Close()
		}
		b.ReportAllocs()
		run(b, func(w int) error {
			lk, err := ls[w].Acquire(ctx, key, locker.WithTTL(10*time.Second))
			if err != nil {
				return err
			}
			time.Sleep(hold) // the critical section
			return lk.Release(ctx)
		})
	})
	b.Run("raw-session", func(b *testing.B) {
		adv := AdvisoryKey("bench-raw", fmt.Sprint(time.Now().UnixNano()))
		conns := make([]*pgx.Conn, workers)
		for i := range conns {
			conns[i] = rawConn(b, url)
		}
		b.ReportAllocs()
		run(b, func(w int) error {
			if _, err := conns[w].Exec(ctx, `SELECT pg_advisory_lock($1)`, adv); err != nil {
				return err
			}
			time.Sleep(hold) // the critical section
			_, err := conns[w].Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv)
			return err
		})
	})
}

// Lease mode, uncontended acquire+release, interleaved with its floor on
// the same pool: each iteration runs each side once, in turn, timed on its
// own. Reported: ns per acquire+release of each and their ratio.
//
//	lease        this driver's lease-mode Acquire + Release (2 statements)
//	locker       package locker on it: TryAcquire + Release
//	floor        INSERT … ON CONFLICT DO NOTHING + DELETE of one row of a
//	             table with a bytea primary key, on the same pool
func BenchmarkLeaseUncontendedInterleaved(b *testing.B) {
	url := leaseURL(serverURL(b))
	ctx := context.Background()
	key := fmt.Sprintf("bench/lease-interleaved/%d", time.Now().UnixNano())
	d := openLeaseT(b, url)
	l := locker.New(openLeaseT(b, url))
	defer l.Close()
	if _, err := d.lease.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS public.locker_bench_raw
		(id bytea PRIMARY KEY, owner bytea NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	id, owner := leaseID("bench-floor", key), []byte("owner")
	var tLease, tLocker, tFloor time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := d.Acquire(ctx, key, "owner", 10*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, key, "owner"); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := d.lease.pool.Exec(ctx, `INSERT INTO public.locker_bench_raw (id, owner, expires_at)
			VALUES ($1, $2, clock_timestamp() + interval '10 seconds') ON CONFLICT (id) DO NOTHING`, id, owner); err != nil {
			b.Fatal(err)
		}
		if _, err := d.lease.pool.Exec(ctx, `DELETE FROM public.locker_bench_raw WHERE id = $1 AND owner = $2`, id, owner); err != nil {
			b.Fatal(err)
		}
		t2 := time.Now()
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(10*time.Second), locker.WithAutoRenew(false))
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		tLease += t1.Sub(t0)
		tFloor += t2.Sub(t1)
		tLocker += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(tLease.Nanoseconds())/n, "lease-ns/op")
	b.ReportMetric(float64(tLocker.Nanoseconds())/n, "locker-ns/op")
	b.ReportMetric(float64(tFloor.Nanoseconds())/n, "floor-ns/op")
	b.ReportMetric(float64(tLease)/float64(tFloor), "lease/floor")
	b.ReportMetric(float64(tLocker)/float64(tFloor), "locker/floor")
}

// Handoff to a waiting Locker in lease mode: two Lockers (as two processes
// would be) pass one key back and forth through package locker. Each
// iteration the holder keeps the key 5ms while the other waits in Acquire,
// then releases it; the handoff is from the start of Release to the
// waiter's Acquire returning. Reported: its p50 and p90.
//
//	direct     connected to PostgreSQL: the waiter is woken by NOTIFY
//	pgbouncer  through PgBouncer in transaction mode: no LISTEN, so the
//	           waiter retries on package locker's backoff
func BenchmarkLeaseHandoff(b *testing.B) {
	b.Run("direct", func(b *testing.B) { benchLeaseHandoff(b, leaseURL(serverURL(b))) })
	b.Run("pgbouncer", func(b *testing.B) {
		srv := pgtest.Start(b)
		port := srv.StartPgBouncer(b)
		benchLeaseHandoff(b, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&mode=lease", port))
	})
}

func benchLeaseHandoff(b *testing.B, url string) {
	const hold, ttl = 5 * time.Millisecond, 10 * time.Second
	ctx := context.Background()
	key := fmt.Sprintf("bench/lease-handoff/%d", time.Now().UnixNano())
	var ls [2]*locker.Locker
	for i := range ls {
		d, err := Driver{}.Open(url)
		if err != nil {
			b.Fatal(err)
		}
		ls[i] = locker.New(d)
		defer ls[i].Close()
	}
	lk, err := ls[0].Acquire(ctx, key, locker.WithTTL(ttl))
	if err != nil {
		b.Fatal(err)
	}
	type grant struct {
		lk  *locker.Lock
		err error
		at  time.Time
	}
	var samples []time.Duration
	w := 1
	for b.Loop() {
		got := make(chan grant, 1)
		go func(l *locker.Locker) {
			lk, err := l.Acquire(ctx, key, locker.WithTTL(ttl))
			got <- grant{lk, err, time.Now()}
		}(ls[w])
		time.Sleep(hold) // the critical section, while the other waits
		released := time.Now()
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
		g := <-got
		if g.err != nil {
			b.Fatal(g.err)
		}
		samples = append(samples, g.at.Sub(released))
		lk, w = g.lk, 1-w
	}
	_ = lk.Release(ctx)
	slices.Sort(samples)
	b.ReportMetric(0, "ns/op")
	b.ReportMetric(float64(samples[len(samples)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(samples[len(samples)*9/10].Microseconds()), "p90-µs")
}

// The lease table's size after b.N acquisitions (acquire + release, by 8
// goroutines on a pool of 8) spread over 10,000 keys, on a private server
// with autovacuum at its defaults. A soak, run by hand:
//
//	heavy go test -run '^$' -bench LeaseTableGrowth -benchtime 1000000x -timeout 60m ./drivers/postgres/
func BenchmarkLeaseTableGrowth(b *testing.B) {
	const keys, workers = 10000, 8
	srv := pgtest.Start(b)
	ctx := context.Background()
	d := openLeaseT(b, leaseURL(srv.URL())+fmt.Sprintf("&pool_max_conns=%d", workers))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := fmt.Sprintf("owner-%d", w)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				key := fmt.Sprintf("growth/%d", i%keys)
				if _, err := d.Acquire(ctx, key, owner, time.Minute); err != nil {
					if errors.Is(err, driver.ErrNotAcquired) {
						continue
					}
					errs <- err
					return
				}
				if err := d.Release(ctx, key, owner); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.StopTimer()
	var table, index, rows int64
	if err := d.lease.pool.QueryRow(ctx, `SELECT pg_table_size('public.locker_leases'), pg_indexes_size('public.locker_leases'),
		(SELECT count(*) FROM public.locker_leases)`).Scan(&table, &index, &rows); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(table), "table-bytes")
	b.ReportMetric(float64(index), "index-bytes")
	b.ReportMetric(float64(rows), "rows")
}

// BenchmarkAdvisoryStatements splits advisory mode's cost over its floor:
// on one server connection (the driver's pool holds just one, and every
// variant runs on it), in an order that rotates every iteration, it times
// acquire+release as
//
//	driver         the driver's Acquire and Release (pool and Go included)
//	full           the driver's two statements, as Acquire and Release send them
//	noapp          without publishing the holder in application_name
//	noapp-noist    without that and without arming idle_session_timeout
//	noapp-noist-nowal  without those and without the check that the token
//	               is durable (a WAL flush when the WAL is behind)
//	floor+nextval  pg_advisory_lock with nextval of the token sequence, and
//	               pg_advisory_unlock
//	floor          pg_advisory_lock and pg_advisory_unlock
//
// (us per acquire+release). The raw variants take the connection from the
// pool before their clock starts and give it back after it stops.
func BenchmarkAdvisoryStatements(b *testing.B) {
	url := serverURL(b)
	ctx := context.Background()
	key := fmt.Sprintf("bench/statements/%d", time.Now().UnixNano())
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	d := openT(b, url+sep+"pool_max_conns=1")
	adv := AdvisoryKey("bench-floor", key)
	full := d.adv.sql.acquire[0][0]
	noApp := strings.Replace(full, "|| set_config('application_name', 'lk/' || to_hex(t.tok) || '/' || $4 || '/' || $5, false)", "|| $4 || $5", 1)
	noIST := strings.Replace(noApp, "set_config('idle_session_timeout', $3, false)", "$3", 1)
	walCheck := `|| CASE WHEN t.logged OR pg_current_wal_flush_lsn() < t.lsn THEN
			CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'local', true) ELSE '' END
			|| CASE WHEN NOT t.logged THEN pg_logical_emit_message(true, 'locker', '')::text ELSE '' END
		ELSE '' END`
	noWAL := strings.Replace(noIST, walCheck, "", 1)
	if noApp == full || noIST == noApp || noWAL == noIST {
		b.Fatal("replace failed")
	}
	rel := d.adv.sql.release
	relNoApp := `SELECT pg_advisory_unlock($1), set_config('idle_session_timeout', $2, false), $3`
	relBare := `SELECT pg_advisory_unlock($1), $2, $3`
	type variant struct {
		name     string
		acq, rel string
	}
	vs := []variant{{"driver", "D", ""}, {"full", full, rel}, {"noapp", noApp, relNoApp}, {"noapp-noist", noIST, relBare}, {"noapp-noist-nowal", noWAL, relBare}, {"floor", "", ""}, {"floor+nextval", "N", ""}}
	t := make([]time.Duration, len(vs))
	i := 0
	for b.Loop() {
		i++
		for j := range vs {
			v := vs[(i+j)%len(vs)]
			if v.acq == "D" {
				t0 := time.Now()
				if _, err := d.Acquire(ctx, key, "owner", 10*time.Second); err != nil {
					b.Fatal(err)
				}
				if err := d.Release(ctx, key, "owner"); err != nil {
					b.Fatal(err)
				}
				t[(i+j)%len(vs)] += time.Since(t0)
				continue
			}
			pc, err := d.adv.pool.Acquire(ctx)
			if err != nil {
				b.Fatal(err)
			}
			conn := pc.Conn()
			pid := conn.PgConn().PID()
			t0 := time.Now()
			if v.acq == "N" {
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1), nextval('public.locker_token_seq'::regclass)`, adv); err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv); err != nil {
					b.Fatal(err)
				}
			} else if v.acq == "" {
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, adv); err != nil {
					b.Fatal(err)
				}
				if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, adv); err != nil {
					b.Fatal(err)
				}
			} else {
				var ok *bool
				var tok *int64
				var ist, app, set *string
				if err := conn.QueryRow(ctx, v.acq, adv, int64(pid), "10000", "2710", "ownertag").Scan(&ok, &tok, &ist, &app, &set); err != nil {
					b.Fatal(err)
				}
				var u bool
				var a1, a2 string
				if err := conn.QueryRow(ctx, v.rel, adv, *ist, *app).Scan(&u, &a1, &a2); err != nil {
					b.Fatal(err)
				}
			}
			t[(i+j)%len(vs)] += time.Since(t0)
			pc.Release()
		}
	}
	n := float64(b.N)
	for k, v := range vs {
		b.ReportMetric(float64(t[k].Nanoseconds())/n/1e3, v.name+"-us")
	}
}

// The session probe (probe.go) with N watched locks held: one look-up of
// every watched lock's session, as the probe makes five times a second.
// Reported besides ns/op (the client's wall time per look-up):
// server-cpu-µs/probe, the CPU time the probe's backend spent per look-up
// (from /proc, so the server must run on this host), and
// cpu-µs/s/lock, the client's and the server's CPU time per second per held
// lock at the probe's rate.
func BenchmarkSessionProbe(b *testing.B) {
	url := serverURL(b)
	for _, n := range []int{1, 10, 100, 200} {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) {
			ctx := context.Background()
			d := openT(b, url)
			prefix := fmt.Sprintf("bench/probe/%d/", time.Now().UnixNano())
			for i := range n {
				key := prefix + strconv.Itoa(i)
				tok, err := d.Acquire(ctx, key, "owner", 10*time.Minute)
				if err != nil {
					b.Fatal(err)
				}
				stop, err := d.WatchHold(key, "owner", tok, func(err error) { b.Errorf("lost %s: %v", key, err) })
				if err != nil {
					b.Fatal(err)
				}
				defer stop()
			}
			holds := d.adv.watchedHolds()
			if len(holds) != n {
				b.Fatalf("%d watched holds, want %d", len(holds), n)
			}
			p := &sessionProber{l: d.adv, cfg: d.adv.pool.Config().ConnConfig}
			defer p.drop()
			if present, _, err := p.lookup(ctx, holds); err != nil || len(present) != n {
				b.Fatalf("look-up: %d found, %v", len(present), err)
			}
			pid := p.conn.PgConn().PID()
			cpu0, cpuServer0 := benchCPU(b, 0), benchCPU(b, pid)
			for b.Loop() {
				if _, _, err := p.lookup(ctx, holds); err != nil {
					b.Fatal(err)
				}
			}
			client, server := benchCPU(b, 0)-cpu0, benchCPU(b, pid)-cpuServer0
			perProbe := (client + server) / time.Duration(b.N)
			b.ReportMetric(float64(server.Microseconds())/float64(b.N), "server-cpu-µs/probe")
			b.ReportMetric(float64(perProbe.Microseconds())*float64(time.Second/probeInterval)/float64(n), "cpu-µs/s/lock")
		})
	}
}

// benchCPU returns the user and system CPU time of process pid from
// /proc/<pid>/stat, or of this process for pid 0.
func benchCPU(b *testing.B, pid uint32) time.Duration {
	b.Helper()
	if pid == 0 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command (which may hold spaces) in parentheses.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		b.Fatalf("parsing /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}
