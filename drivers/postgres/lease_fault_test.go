package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// terminateClients terminates every client backend on the server but the
// caller's own, and returns how many.
func terminateClients(t *testing.T, p *pgxpool.Pool) int {
	t.Helper()
	conn, err := p.Acquire(ctxFor(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var n int
	err = conn.QueryRow(ctxFor(t, 30*time.Second), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'`).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A lease outlives the backends that took and refreshed it. With every
// client backend terminated (the holder's pool, the waiter's pool and its
// listener), the holder's next Refresh succeeds on a new connection and
// keeps the lock; terminated again and no longer refreshed, the lock goes
// to the waiting Locker no earlier than the TTL after the holder's last
// refresh was sent, with a higher token, and the holder cannot revive it.
func TestLeaseBackendTerminated(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, 2*time.Minute)
	url := leaseURL(srv.URL())
	admin := poolT(t, srv.URL())
	holder := openLeaseT(t, url)
	waiter := locker.New(openLeaseT(t, url))
	defer waiter.Close()
	const ttl = 2 * time.Second
	key := "terminated"
	tok, err := holder.Acquire(ctx, key, "holder", ttl)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		lk  *locker.Lock
		err error
		at  time.Time
	}
	got := make(chan grant, 1)
	go func() {
		lk, err := waiter.Acquire(ctx, key, locker.WithTTL(time.Minute))
		got <- grant{lk, err, time.Now()}
	}()
	if n := terminateClients(t, admin); n == 0 {
		t.Fatal("no backend terminated")
	}
	refreshed := time.Now()
	if err := holder.Refresh(ctx, key, "holder", ttl); err != nil {
		t.Fatalf("Refresh after the holder's backends were terminated: %v", err)
	}
	terminateClients(t, admin)
	var g grant
	select {
	case g = <-got:
	case <-ctx.Done():
		t.Fatal("the waiter was never granted the lock")
	}
	if g.err != nil {
		t.Fatal(g.err)
	}
	defer g.lk.Release(context.Background())
	t.Logf("granted %v after the holder's last refresh (TTL %v)", g.at.Sub(refreshed), ttl)
	if g.at.Before(refreshed.Add(ttl)) {
		t.Fatalf("the waiter was granted %v after the holder's last refresh, before its TTL %v", g.at.Sub(refreshed), ttl)
	}
	if g.at.After(refreshed.Add(ttl + 2*time.Second)) {
		t.Fatalf("the waiter was granted %v after the holder's last refresh: more than 2s after its TTL", g.at.Sub(refreshed))
	}
	if g.lk.Token() <= tok {
		t.Fatalf("the waiter's token %d is not above the holder's %d", g.lk.Token(), tok)
	}
	if err := holder.Refresh(ctx, key, "holder", ttl); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("the holder's Refresh after expiry: %v, want ErrNotHeld", err)
	}
}

// countRefresh counts a driver's Refresh calls.
type countRefresh struct {
	driver.Locker
	n atomic.Int64
}

func (c *countRefresh) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	c.n.Add(1)
	return c.Locker.Refresh(ctx, key, owner, ttl)
}

func (c *countRefresh) Capabilities() driver.Capabilities {
	return c.Locker.(driver.Capable).Capabilities()
}

// cpuTime returns the process's user and system CPU time.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// 10,000 locks held at once by one process through package locker, on a
// pool of at most 8 connections, renewed by package locker: all are
// acquired, the server never sees more than 8 sessions of the pool (plus
// the renewal connection), and
// none is lost while renewing. Logged: the client CPU time per renewal.
func TestLease10000Locks(t *testing.T) {
	// A TTL of 20s needs 1,500 renewals a second, little more than half of what
	// the pool managed on a loaded 2-core run (2,700/s under -race).
	const n, conns, ttl = 10000, 8, 20 * time.Second
	url := leaseURL(serverURL(t)) + fmt.Sprintf("&pool_max_conns=%d&application_name=lease10k", conns)
	ctx := ctxFor(t, 5*time.Minute)
	d := &countRefresh{Locker: openLeaseT(t, url)}
	l := locker.New(d)
	defer l.Close()
	prefix := fmt.Sprintf("10k/%d/", time.Now().UnixNano())
	locks := make([]*locker.Lock, n)
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, 32)
	start := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				lk, err := l.TryAcquire(ctx, prefix+fmt.Sprint(i), locker.WithTTL(ttl))
				if err != nil {
					errs <- err
					return
				}
				locks[i] = lk
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("acquire: %v", err)
	}
	t.Logf("%d locks acquired in %v on a pool of %d", n, time.Since(start), conns)

	// Renewal for 1.5 renewal periods (TTL/3 each).
	r0, c0 := d.n.Load(), cpuTime(t)
	window := ttl / 2
	timer := time.NewTimer(window)
	for _, lk := range locks {
		select {
		case <-lk.Lost():
			t.Fatalf("%s lost while renewing: %v", lk.Key(), lk.Err())
		default:
		}
	}
	<-timer.C
	r1, c1 := d.n.Load(), cpuTime(t)
	renewals := r1 - r0
	if renewals < n {
		t.Fatalf("%d renewals in %v, want at least %d", renewals, window, n)
	}
	t.Logf("%d renewals in %v: client CPU %v per renewal", renewals, window, (c1-c0)/time.Duration(renewals))

	var sessions int
	admin := poolT(t, serverURL(t))
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lease10k'`).Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	if sessions > conns+1 {
		t.Fatalf("%d server sessions for the pool of %d and the renewal connection", sessions, conns)
	}
	var held int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM public.locker_leases WHERE key LIKE $1 AND expires_at > clock_timestamp()`,
		[]byte(prefix+"%")).Scan(&held); err != nil {
		t.Fatal(err)
	}
	if held != n {
		t.Fatalf("%d leases live on the server, want %d", held, n)
	}
	for _, lk := range locks {
		select {
		case <-lk.Lost():
			t.Fatalf("%s lost while renewing: %v", lk.Key(), lk.Err())
		default:
		}
	}
	next.Store(0)
	errs = make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := locks[i].Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("release: %v", err)
	}
}

// A reset of every connection of a lease-mode Locker (its pool full of
// idle connections) costs the next Acquire retries, not a failure: the
// pool hands out each broken connection before it finds out, so a
// statement is retried on more connections than the pool holds.
func TestLeaseAcquireAfterPoolReset(t *testing.T) {
	p, url := proxyFor(t, serverURL(t))
	l := openT(t, leaseURL(url))
	ctx := ctxFor(t, 30*time.Second)
	// Fill the pool: as many statements at once as it holds.
	n := int(l.lease.pool.Config().MaxConns)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, _ = l.Inspect(ctx, fmt.Sprintf("poolreset/fill/%d", i))
		})
	}
	wg.Wait()
	if got := l.lease.pool.Stat().IdleConns(); got < int32(n) {
		t.Fatalf("%d idle connections, want the pool's %d", got, n)
	}
	if p.Reset() == 0 {
		t.Fatal("the proxy reset no connection")
	}
	key := fmt.Sprintf("poolreset/%d", time.Now().UnixNano())
	if _, err := l.Acquire(ctx, key, "owner", time.Minute); err != nil {
		t.Fatalf("Acquire after every pooled connection was reset: %v", err)
	}
	if err := l.Release(ctx, key, "owner"); err != nil {
		t.Fatal(err)
	}
}
