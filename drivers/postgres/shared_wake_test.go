package postgres

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/go-locker/locker/driver"
)

// stmtCounter is a pgx tracer counting the statements whose text contains
// match.
type stmtCounter struct {
	match string
	n     atomic.Int64
}

func (c *stmtCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.Contains(d.SQL, c.match) {
		c.n.Add(1)
	}
	return ctx
}

func (c *stmtCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// openCounted is a Locker in mode on schema over a pool of its own whose
// statements containing match are counted.
func openCounted(t *testing.T, mode, schema, match string) (*Locker, *stmtCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := &stmtCounter{match: match}
	cfg.ConnConfig.Tracer = c
	ctx := ctxFor(t, 30*time.Second)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l, err := New(ctx, pool, &Options{Mode: mode, Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, c
}

// leaseListener is a connection LISTENing on the lease channel, and the
// payloads it received.
type leaseListener struct {
	conn *pgconn.PgConn
	got  []string
}

// listenLease is a connection LISTENing on the lease channel.
func listenLease(t *testing.T, ctx context.Context) *leaseListener {
	t.Helper()
	cfg, err := pgconn.ParseConfig(serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ll := &leaseListener{}
	cfg.OnNotification = func(_ *pgconn.PgConn, n *pgconn.Notification) { ll.got = append(ll.got, n.Payload) }
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ll.conn = conn
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, `LISTEN `+leaseChannel).ReadAll(); err != nil {
		t.Fatal(err)
	}
	return ll
}

// next waits (bounded by ctx) for the next notification's payload.
func (ll *leaseListener) next(t *testing.T, ctx context.Context) string {
	t.Helper()
	p, err := ll.wait(ctx)
	if err != nil {
		t.Fatalf("waiting for a notification: %v", err)
	}
	return p
}

// wait waits (bounded by ctx) for the next notification's payload.
func (ll *leaseListener) wait(ctx context.Context) (string, error) {
	for len(ll.got) == 0 {
		if err := ll.conn.WaitForNotification(ctx); err != nil {
			return "", err
		}
	}
	p := ll.got[0]
	ll.got = ll.got[1:]
	return p, nil
}

// In lease mode a release wakes only the waiter it lets in: five waiters
// (separate Lockers, as separate processes) queue in turn for a semaphore
// of 1; each release sends one notification, naming the next waiter in
// arrival order, and that waiter is granted. Each waiter runs the acquire
// statement twice (queued, granted), plus at most one fallback retry per
// leaseWaitFallback it waited; every waiter woken by every release would
// run it once more per release before its grant.
func TestSharedLeaseWakesOnlyGrantable(t *testing.T) {
	schema := fmt.Sprintf("shared_wake_%d", time.Now().UnixNano())
	ctx := ctxFor(t, time.Minute)
	holder := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	lis := listenLease(t, ctx)
	const key, n = "wake", 5
	id := sharedLeaseID(holder.lease.ns, driver.SharedPermit, key)
	if _, err := holder.AcquireShared(ctx, key, sreq(driver.SharedPermit, "holder", time.Minute, 1, false)); err != nil {
		t.Fatal(err)
	}
	type waiter struct {
		l       *Locker
		c       *stmtCounter
		owner   string
		granted chan error
		start   time.Time
		waited  time.Duration
	}
	ws := make([]*waiter, n)
	for i := range ws {
		l, c := openCounted(t, ModeLease, schema, "acquire_v4")
		w := &waiter{l: l, c: c, owner: fmt.Sprintf("w%d", i), granted: make(chan error, 1), start: time.Now()}
		ws[i] = w
		go func() {
			_, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, w.owner, time.Minute, 1, true))
			w.granted <- err
		}()
		waitQueuedN(t, ctx, holder, schema, driver.SharedPermit, key, i+1)
	}
	prev := "holder"
	for i, w := range ws {
		if err := holder.ReleaseShared(ctx, key, driver.SharedPermit, prev); err != nil {
			t.Fatal(err)
		}
		if got, want := lis.next(t, ctx), sharedWakePayload(id, w.owner); got != want {
			t.Fatalf("release %d notified %q; want only waiter %s's %q", i, got, w.owner, want)
		}
		if err := <-w.granted; err != nil {
			t.Fatalf("waiter %s: %v", w.owner, err)
		}
		w.waited = time.Since(w.start)
		prev = w.owner
	}
	if err := holder.ReleaseShared(ctx, key, driver.SharedPermit, prev); err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		allowed := 2 + int64(w.waited/(leaseWaitFallback*9/10))
		if got := w.c.n.Load(); got < 2 || got > allowed {
			t.Errorf("waiter %s ran the acquire statement %d times in %v; want 2 to %d", w.owner, got, w.waited, allowed)
		}
	}
}

// waitQueuedN waits until n requests are queued on the lease-mode lock
// mode names on key.
func waitQueuedN(t *testing.T, ctx context.Context, l *Locker, schema string, mode driver.SharedMode, key string, n int) {
	t.Helper()
	table := pgx.Identifier{schema, SharedTableName}.Sanitize()
	id := sharedLeaseID(l.lease.ns, mode, key)
	for deadline := time.Now().Add(10 * time.Second); ; {
		var got int
		err := l.lease.pool.QueryRow(ctx, `SELECT coalesce(array_length(w_owner, 1), 0) FROM `+table+` WHERE id = $1`, id).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued after 10s; want %d", got, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// In lease mode, when holders expire, only the first waiter retries at
// their expiry, and it tells the next: two holders of a semaphore of 2
// stop renewing (crashed; their TTLs end 300ms apart), three waiters
// queue; the first is granted after the first expiry and its acquire
// notifies the second alone (which is then first and retries at the second
// expiry, or is let in at once), which is granted too; the third stays
// queued and is never notified.
func TestSharedLeaseExpiryWakesGrantable(t *testing.T) {
	schema := fmt.Sprintf("shared_expwake_%d", time.Now().UnixNano())
	ctx := ctxFor(t, time.Minute)
	holder := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	lis := listenLease(t, ctx)
	const key = "expiry"
	id := sharedLeaseID(holder.lease.ns, driver.SharedPermit, key)
	ls := make([]*Locker, 3)
	for i := range ls {
		ls[i] = openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	}
	// The holders expire one after the other, before any waiter's
	// fallback retry.
	for i, o := range []string{"h1", "h2"} {
		ttl := time.Second + time.Duration(i)*300*time.Millisecond
		if _, err := holder.AcquireShared(ctx, key, sreq(driver.SharedPermit, o, ttl, 2, false)); err != nil {
			t.Fatal(err)
		}
	}
	granted := make([]chan error, 3)
	for i, l := range ls {
		granted[i] = make(chan error, 1)
		go func() {
			_, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, fmt.Sprintf("w%d", i), time.Minute, 2, true))
			granted[i] <- err
		}()
		waitQueuedN(t, ctx, holder, schema, driver.SharedPermit, key, i+1)
	}
	nctx, ncancel := context.WithTimeout(ctx, 15*time.Second)
	defer ncancel()
	got, err := lis.wait(nctx)
	if err != nil {
		for i, g := range granted {
			select {
			case err := <-g:
				t.Errorf("w%d ended: %v", i, err)
			default:
			}
		}
		t.Fatalf("waiting for a notification: %v", err)
	}
	if want := sharedWakePayload(id, "w1"); got != want {
		t.Fatalf("after the expiry %q was notified; want only w1's %q", got, want)
	}
	for i := range 2 {
		if err := <-granted[i]; err != nil {
			t.Fatalf("w%d: %v", i, err)
		}
	}
	select {
	case err := <-granted[2]:
		t.Fatalf("w2 was granted (%v) with two holders of a semaphore of 2", err)
	default:
	}
	if len(lis.got) != 0 {
		t.Fatalf("further notifications %q; want none", lis.got)
	}
}

// In lease mode a waiter that crashed while queued holds back the waiters
// behind it only until its queue entry lapses: an entry left by a waiter
// that is gone (made by the acquire statement, with no process behind it)
// is ahead of a live waiter; after the holder releases, the live waiter is
// granted within the entry's lifetime and one fallback retry.
func TestSharedLeaseCrashedWaiterDoesNotBlock(t *testing.T) {
	schema := fmt.Sprintf("shared_crashwait_%d", time.Now().UnixNano())
	ctx := ctxFor(t, time.Minute)
	l := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	const key = "crash"
	id := sharedLeaseID(l.lease.ns, driver.SharedWrite, key)
	if _, err := l.AcquireShared(ctx, key, sreq(driver.SharedWrite, "holder", time.Minute, 0, false)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := l.lease.pool.QueryRow(ctx, l.lease.shsql.acquire, id, []byte(key), []byte("dead"), int32(driver.SharedWrite),
		int32(0), int64(60000), true).Scan(new(*int64), new(*int64), new(bool), new(bool), new(string)); err != nil {
		t.Fatal(err)
	}
	l2 := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	granted := make(chan error, 1)
	go func() {
		_, err := l2.AcquireShared(ctx, key, sreq(driver.SharedWrite, "live", time.Minute, 0, true))
		granted <- err
	}()
	waitQueuedN(t, ctx, l, schema, driver.SharedWrite, key, 2)
	if err := l.ReleaseShared(ctx, key, driver.SharedWrite, "holder"); err != nil {
		t.Fatal(err)
	}
	bound := time.Duration(sharedIntentTTLms)*time.Millisecond + leaseWaitFallback*11/10 + time.Second
	select {
	case err := <-granted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound - time.Since(start)):
		t.Fatalf("the live waiter was not granted %v after the crashed waiter queued", bound)
	}
}

// In lease mode a queue whose limits are out of step with its owners (as
// an acquire of the earlier version, which keeps no limits, leaves it
// during a rolling upgrade) wakes too many waiters, never too few, and the
// limit still holds: with three permit waiters of a semaphore of 1 queued
// and the limits cleared, a release notifies all three, and only the first
// is granted.
func TestSharedLeaseWakeLimitsOutOfStep(t *testing.T) {
	schema := fmt.Sprintf("shared_wakestep_%d", time.Now().UnixNano())
	ctx := ctxFor(t, time.Minute)
	holder := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
	lis := listenLease(t, ctx)
	const key = "step"
	id := sharedLeaseID(holder.lease.ns, driver.SharedPermit, key)
	if _, err := holder.AcquireShared(ctx, key, sreq(driver.SharedPermit, "holder", time.Minute, 1, false)); err != nil {
		t.Fatal(err)
	}
	granted := make(chan string, 3)
	for i := range 3 {
		l := openT(t, leaseURL(serverURL(t))+"&schema="+schema)
		owner := fmt.Sprintf("w%d", i)
		go func() {
			if _, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, owner, time.Minute, 1, true)); err == nil {
				granted <- owner
			}
		}()
		waitQueuedN(t, ctx, holder, schema, driver.SharedPermit, key, i+1)
	}
	table := pgx.Identifier{schema, SharedTableName}.Sanitize()
	if _, err := holder.lease.pool.Exec(ctx, `UPDATE `+table+` SET w_lim = '{}' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if err := holder.ReleaseShared(ctx, key, driver.SharedPermit, "holder"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if got, want := lis.next(t, ctx), sharedWakePayload(id, fmt.Sprintf("w%d", i)); got != want {
			t.Fatalf("notification %d is %q; want w%d's %q", i, got, i, want)
		}
	}
	if got := <-granted; got != "w0" {
		t.Fatalf("%s granted first; want w0", got)
	}
	hs, err := holder.InspectShared(ctx, key, driver.SharedPermit)
	if err != nil || len(hs) != 1 || hs[0].Owner != "w0" {
		t.Fatalf("holders %+v, %v; want w0 alone", hs, err)
	}
}
