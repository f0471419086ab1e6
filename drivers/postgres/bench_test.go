package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker"
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
