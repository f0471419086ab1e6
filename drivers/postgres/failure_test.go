package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const contSignal = syscall.SIGCONT

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func poolT(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(ctxFor(t, time.Minute), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// holderPID returns the backend pid holding key's advisory lock, or 0.
func holderPID(t testing.TB, p rowQuerier, ns, key string) int {
	t.Helper()
	adv := AdvisoryKey(ns, key)
	var pid int
	err := p.QueryRow(ctxFor(t, 30*time.Second), `SELECT coalesce((SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = $1 AND objid = $2 AND objsubid = 1 LIMIT 1), 0)`,
		uint32(uint64(adv)>>32), uint32(uint64(adv))).Scan(&pid)
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// rowQuerier is a *pgx.Conn or a *pgxpool.Pool.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// queuedFor returns how many sessions wait in the server for key's
// advisory lock.
func queuedFor(t *testing.T, q rowQuerier, key string) int {
	t.Helper()
	adv := AdvisoryKey(DefaultNamespace, key)
	var n int
	if err := q.QueryRow(ctxFor(t, 30*time.Second), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
		AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = 1`,
		uint32(uint64(adv)>>32), uint32(uint64(adv))).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitLost waits for lk.Lost() to close.
func waitLost(t *testing.T, lk *locker.Lock, limit time.Duration, why string) {
	t.Helper()
	select {
	case <-lk.Lost():
	case <-time.After(limit):
		t.Fatalf("%s: Lost() did not fire within %v", why, limit)
	}
}

// A holder process is frozen (SIGSTOP) for longer than the TTL while its TCP
// connection stays up: the server frees the lock within TTL plus a small
// bound, another owner acquires, and on resume the old holder learns it lost
// the lock, with a lower token than the new one.
func TestPausedHolder(t *testing.T) {
	url := serverURL(t)
	key := fmt.Sprintf("paused/%d", time.Now().UnixNano())
	ttl := time.Second
	c := startHolderChild(t, url, key, "child-owner", ttl)
	line := c.expect(t, "ACQUIRED ", 60*time.Second)
	var childTok uint64
	if _, err := fmt.Sscanf(line, "ACQUIRED %d", &childTok); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	d := openT(t, url)
	// The server's clock for the holder: before this Inspect is sent, its
	// session cannot expire earlier than before+Remaining.
	before := time.Now()
	info, err := d.Inspect(ctxFor(t, 30*time.Second), key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	after := time.Now()
	if info.Owner != "child-owner" || info.Token != childTok || info.Remaining <= 0 || info.Remaining > ttl {
		t.Fatalf("Inspect = %+v, want owner child-owner, token %d, remaining in (0, %v]", info, childTok, ttl)
	}
	tok, err := d.AcquireWait(ctxFor(t, 60*time.Second), key, "parent", 10*time.Second)
	granted := time.Now()
	if err != nil {
		t.Fatalf("AcquireWait: %v", err)
	}
	if earliest := before.Add(info.Remaining); granted.Before(earliest) {
		t.Fatalf("granted %v before the frozen holder's TTL ran out", earliest.Sub(granted))
	}
	late := granted.Sub(after.Add(info.Remaining))
	t.Logf("server freed the frozen holder's lock %v after its TTL (upper estimate)", late)
	if late > expiryBound {
		t.Fatalf("lock freed %v after the TTL, want within %v", late, expiryBound)
	}
	if tok <= childTok {
		t.Fatalf("new token %d not above the frozen holder's %d", tok, childTok)
	}
	if err := c.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line = c.expect(t, "LOST ", 60*time.Second)
	var lostTok uint64
	var notHeld bool
	if _, err := fmt.Sscanf(line, "LOST %d notheld=%t", &lostTok, &notHeld); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	if !notHeld {
		t.Fatalf("resumed holder's Refresh: %s, want ErrNotHeld", line)
	}
	if lostTok >= tok {
		t.Fatalf("old holder's token %d not below the new %d", lostTok, tok)
	}
	if err := d.Release(ctxFor(t, 30*time.Second), key, "parent"); err != nil {
		t.Fatal(err)
	}
}

// expiryBound is how soon after the TTL the server frees an unrenewed lock
// (the package documentation and the README quote it).
const expiryBound = 500 * time.Millisecond

// How fast the server frees an unrenewed lock: the grant to a waiter blocked
// in the server comes at TTL plus the server's timer and process-exit
// latency. Lower bound, exact: no grant before the holder's acquire was sent
// plus TTL. Upper bound: expiryBound.
func TestExpiryLatency(t *testing.T) {
	url := serverURL(t)
	a, b := openT(t, url), openT(t, url)
	ttl := 200 * time.Millisecond
	var lates, lows []time.Duration
	for i := range 8 {
		key := fmt.Sprintf("expiry/%d/%d", time.Now().UnixNano(), i)
		sent := time.Now()
		if _, err := a.Acquire(ctxFor(t, 30*time.Second), key, "holder", ttl); err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		if _, err := b.AcquireWait(ctxFor(t, 30*time.Second), key, "waiter", time.Minute); err != nil {
			t.Fatal(err)
		}
		late := time.Since(sent) - ttl
		if late < 0 {
			t.Fatalf("granted %v before the TTL", -late)
		}
		if late > expiryBound {
			t.Fatalf("granted %v after the TTL, want within %v", late, expiryBound)
		}
		lates = append(lates, late)
		lows = append(lows, time.Since(returned)-ttl)
		if err := b.Release(ctxFor(t, 30*time.Second), key, "waiter"); err != nil {
			t.Fatal(err)
		}
	}
	// The holder's session went idle between sent and returned, so the true
	// delay lies between the two measures.
	slices.Sort(lates)
	slices.Sort(lows)
	t.Logf("grant after TTL %v, %d runs: median between %v and %v, max between %v and %v",
		ttl, len(lates), lows[len(lows)/2], lates[len(lates)/2], lows[len(lows)-1], lates[len(lates)-1])
}

// The server is restarted (crashed) while locks are held: holders learn
// they lost them, and tokens keep increasing — also for a grant made just
// before the crash.
func TestServerRestart(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := locker.New(openT(t, srv.URL())), locker.New(openT(t, srv.URL()))
	ttl := 2 * time.Second
	var last uint64
	for round := range 3 {
		key := fmt.Sprintf("restart/%d", round)
		lk := acquireRetry(t, a, key, ttl)
		if lk.Token() <= last {
			t.Fatalf("round %d: token %d not above %d", round, lk.Token(), last)
		}
		srv.Restart(t)
		waitLost(t, lk, ttl+10*time.Second, "after a server crash")
		lk2 := acquireRetry(t, b, key, ttl)
		if lk2.Token() <= lk.Token() {
			t.Fatalf("round %d: token %d after restart not above %d", round, lk2.Token(), lk.Token())
		}
		last = lk2.Token()
		if err := lk2.Release(ctxFor(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
}

// acquireRetry takes key, retrying errors from connections the restart
// broke (pooled connections find out on first use).
func acquireRetry(t *testing.T, l *locker.Locker, key string, ttl time.Duration) *locker.Lock {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		lk, err := l.Acquire(ctxFor(t, 30*time.Second), key, locker.WithTTL(ttl))
		if err == nil {
			return lk
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire %q: %v", key, err)
		}
	}
}

// A wait cancelled by its context leaves nothing queued in the server.
func TestAcquireWaitCancel(t *testing.T) {
	url := serverURL(t)
	a, b := openT(t, url), openT(t, url)
	key := fmt.Sprintf("cancel/%d", time.Now().UnixNano())
	if _, err := a.Acquire(ctxFor(t, 30*time.Second), key, "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.AcquireWait(ctx, key, "waiter", time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireWait: %v, want DeadlineExceeded", err)
	}
	if el := time.Since(start); el > 300*time.Millisecond+5*time.Second {
		t.Fatalf("AcquireWait returned %v after its deadline", el)
	}
	p := poolT(t, url)
	deadline := time.Now().Add(30 * time.Second)
	for {
		waiting := queuedFor(t, p, key)
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters still queued in the server", waiting)
		}
		time.Sleep(10 * time.Millisecond) // polling the server is the check
	}
	if err := a.Release(ctxFor(t, 30*time.Second), key, "holder"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctxFor(t, 30*time.Second), key, "third", time.Minute); err != nil {
		t.Fatalf("after the cancelled wait: %v", err)
	}
	_ = a.Release(ctxFor(t, 30*time.Second), key, "third")
}

// An AcquireWait blocked in the server and cut short, by its context or by
// Close, right as the holder lets go leaves nothing behind: once it and the
// holder's Release have returned, the key is neither held nor waited for on
// the server, whether or not the wait was granted before the cut. A grant
// that wins the race is returned; Close releases it before it returns.
func TestAcquireWaitCutShortLeavesNothing(t *testing.T) {
	url := serverURL(t)
	a, probe := openT(t, url), openT(t, url)
	p := poolT(t, url)
	ctx := ctxFor(t, 2*time.Minute)
	const rounds = 40
	cut := 0
	for i := range rounds {
		key := fmt.Sprintf("cutshort/%d/%d", time.Now().UnixNano(), i)
		if _, err := a.Acquire(ctx, key, "holder", time.Minute); err != nil {
			t.Fatal(err)
		}
		b := openT(t, url)
		wctx, cancel := context.WithCancel(ctx)
		type result struct {
			tok uint64
			err error
		}
		got := make(chan result, 1)
		go func() {
			tok, err := b.AcquireWait(wctx, key, "waiter", time.Minute)
			got <- result{tok, err}
		}()
		for deadline := time.Now().Add(10 * time.Second); queuedFor(t, p, key) != 1; {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the waiter was not queued within 10s", i)
			}
			time.Sleep(2 * time.Millisecond) // polling the server is the check
		}
		relErr := make(chan error, 1)
		go func() { relErr <- a.Release(ctx, key, "holder") }()
		time.Sleep(time.Duration(i%8) * 250 * time.Microsecond)
		if i%2 == 0 {
			cancel()
		} else {
			_ = b.Close()
		}
		r := <-got
		cancel()
		// The holder's own Release may still be under way when a wait cut
		// short before the hand-over returns: wait for it, so that the key
		// held below can only be a grant the waiter left behind.
		if err := <-relErr; err != nil {
			t.Fatalf("round %d: the holder's Release: %v", i, err)
		}
		switch {
		case r.err == nil && i%2 == 1:
			// Close came after the grant, and released it.
			if in, err := probe.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("round %d: the moment Close returned, the grant that won the race: Inspect = %+v, %v; want ErrNotHeld", i, in, err)
			}
		case r.err == nil:
			if err := b.Release(ctx, key, "waiter"); err != nil {
				t.Fatalf("round %d: releasing the grant that won the race: %v", i, err)
			}
		default:
			if !errors.Is(r.err, context.Canceled) && !errors.Is(r.err, driver.ErrClosed) {
				t.Fatalf("round %d: AcquireWait: %v, want Canceled or ErrClosed", i, r.err)
			}
			cut++
			if in, err := probe.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
				t.Fatalf("round %d: once the cut-short AcquireWait and the holder's Release returned, Inspect = %+v, %v; want ErrNotHeld", i, in, err)
			}
			if n := queuedFor(t, p, key); n != 0 {
				t.Fatalf("round %d: %d waits still queued once the cut-short AcquireWait returned", i, n)
			}
		}
		_ = b.Close()
	}
	t.Logf("%d of %d waits cut short", cut, rounds)
	if cut == 0 {
		t.Fatal("no wait was cut short: the race was never run")
	}
}

// The fallback of a cut-short wait whose cancel request the server did not
// act on: its connection is closed without telling the server (the backend
// stays queued in the lock manager, where it does not read its socket),
// and abandon terminates that backend before it returns, so the key is
// neither waited for nor, after the holder lets go, taken by it.
func TestAbandonTerminatesQueuedBackend(t *testing.T) {
	url := serverURL(t)
	a := openT(t, url)
	p := poolT(t, url)
	ctx := ctxFor(t, time.Minute)
	key := fmt.Sprintf("abandon/%d", time.Now().UnixNano())
	if _, err := a.Acquire(ctx, key, "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	l := a.adv
	conn, err := l.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adv := AdvisoryKey(DefaultNamespace, key)
	done := make(chan error, 1)
	go func() {
		_, err := conn.Exec(context.Background(), `SELECT pg_advisory_lock($1)`, adv)
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); queuedFor(t, p, key) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the wait was not queued within 10s")
		}
		time.Sleep(2 * time.Millisecond) // polling the server is the check
	}
	_ = conn.Conn().PgConn().Conn().Close() // the socket only: the server is not told
	if err := <-done; err == nil {
		t.Fatal("the wait on a closed socket succeeded")
	}
	if n := queuedFor(t, p, key); n != 1 {
		t.Fatalf("%d waits queued after the socket closed, want the one left behind", n)
	}
	start := time.Now()
	l.abandon(conn, adv)
	t.Logf("abandon took %v", time.Since(start))
	if n := queuedFor(t, p, key); n != 0 {
		t.Fatalf("%d waits still queued once abandon returned", n)
	}
	if err := a.Release(ctx, key, "holder"); err != nil {
		t.Fatal(err)
	}
	if in, err := a.Inspect(ctx, key); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("after the holder's release: Inspect = %+v, %v; want ErrNotHeld (the abandoned wait took the key)", in, err)
	}
}

// A waiter blocked in the server goes on waiting through a crash of the
// server (SIGKILL: its session ends with a reset, no server error) and a
// restart: it is granted the key, which the crash freed, with a token above
// the crashed holder's, instead of giving up with ErrUnavailable while the
// server is down.
func TestAcquireWaitAcrossCrash(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := openT(t, srv.URL()), openT(t, srv.URL())
	key := fmt.Sprintf("crashwait/%d", time.Now().UnixNano())
	tok, err := a.Acquire(ctxFor(t, 30*time.Second), key, "holder", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan crashResult, 1)
	go func() {
		tok, err := b.AcquireWait(ctxFor(t, 60*time.Second), key, "waiter", time.Minute)
		got <- crashResult{tok, err}
	}()
	q := poolT(t, srv.URL())
	deadline := time.Now().Add(30 * time.Second)
	for queuedFor(t, q, key) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued in the server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	q.Close()
	srv.Kill(t)
	select {
	case r := <-got:
		t.Fatalf("AcquireWait returned while the server was down: %d, %v", r.tok, r.err)
	default:
	}
	srv.Restart(t)
	grantedAfterRestart(t, got, tok, "AcquireWait")
}

// crashResult is the outcome of a wait made across a server crash.
type crashResult struct {
	tok uint64
	err error
}

// grantedAfterRestart checks that the wait whose outcome comes on got is
// granted, within 30s of the restart, a token above the crashed holder's.
func grantedAfterRestart(t *testing.T, got <-chan crashResult, holder uint64, what string) {
	t.Helper()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("%s across the crash: %v", what, r.err)
		}
		if r.tok <= holder {
			t.Fatalf("token %d after the crash not above the holder's %d", r.tok, holder)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s not granted within 30s of the restart", what)
	}
}

// A permit wait in advisory mode (a semaphore's Acquire, retried on the
// permit wait schedule) goes on through a crash and restart of the server
// once it has reached the server, as AcquireWait does.
func TestPermitWaitAcrossCrash(t *testing.T) {
	srv := pgtest.Start(t)
	a, b := openT(t, srv.URL()), openT(t, srv.URL())
	key := fmt.Sprintf("crashpermit/%d", time.Now().UnixNano())
	tok, err := a.AcquireShared(ctxFor(t, 30*time.Second), key, sreq(driver.SharedPermit, "holder", time.Minute, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan crashResult, 1)
	go func() {
		tok, err := b.AcquireShared(ctxFor(t, 60*time.Second), key, sreq(driver.SharedPermit, "waiter", time.Minute, 1, true))
		got <- crashResult{tok, err}
	}()
	// Both the holder's and the waiter's sessions have run the permit
	// statement: the wait has reached the server.
	q := poolT(t, srv.URL())
	deadline := time.Now().Add(30 * time.Second)
	for {
		var n int
		if err := q.QueryRow(ctxFor(t, 30*time.Second), `SELECT count(*) FROM pg_stat_activity
			WHERE pid <> pg_backend_pid() AND query LIKE '%SELECT t.ok, t.tok%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter's attempt never reached the server")
		}
		time.Sleep(5 * time.Millisecond)
	}
	q.Close()
	srv.Kill(t)
	srv.Restart(t)
	grantedAfterRestart(t, got, tok, "permit wait")
}
