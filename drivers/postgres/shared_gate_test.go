package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/go-locker/locker/driver"
)

// gateState is how many sessions hold and wait for the gate of the
// advisory-mode semaphore on key.
func gateState(t *testing.T, ctx context.Context, l *Locker, key string) (held, waiting int) {
	t.Helper()
	g := uint64(sharedAdv(l.adv.ns, driver.SharedPermit, key) + permitGate)
	err := l.adv.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) FROM pg_locks
		WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		uint32(g>>32), uint32(g)).Scan(&held, &waiting)
	if err != nil {
		t.Fatal(err)
	}
	return held, waiting
}

// waitGate waits until the gate of the semaphore on key is held by one
// session and waited for by waiting.
func waitGate(t *testing.T, ctx context.Context, l *Locker, key string, waiting int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		h, w := gateState(t, ctx, l, key)
		if h == 1 && w == waiting {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gate held by %d, waited for by %d after 10s; want 1 and %d", h, w, waiting)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// In advisory mode waiting permits queue on the semaphore's gate in the
// server's lock manager: five waiters (separate Lockers, as separate
// processes) queue in turn for a semaphore of 1; while the first, the
// gate's holder, tries the slots three times, the others make no
// statement after their first; once the holder releases, the waiters are
// granted in arrival order.
func TestSharedAdvisoryPermitFIFO(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	holder := openT(t, serverURL(t))
	key := fmt.Sprintf("gatefifo/%d", time.Now().UnixNano())
	if _, err := holder.AcquireShared(ctx, key, sreq(driver.SharedPermit, "holder", time.Minute, 1, false)); err != nil {
		t.Fatal(err)
	}
	const n = 5
	counters := make([]*stmtCounter, n)
	order := make(chan string, n)
	errs := make(chan error, n)
	for i := range n {
		l, c := openCounted(t, ModeAdvisory, DefaultSchema, "SELECT t.ok, t.tok")
		counters[i] = c
		owner := fmt.Sprintf("w%d", i)
		go func() {
			_, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, owner, time.Minute, 1, true))
			if err == nil {
				order <- owner
				err = l.ReleaseShared(context.WithoutCancel(ctx), key, driver.SharedPermit, owner)
			}
			errs <- err
		}()
		waitGate(t, ctx, holder, key, i)
	}
	for deadline := time.Now().Add(10 * time.Second); counters[0].n.Load() < 3; {
		if time.Now().After(deadline) {
			t.Fatalf("the first waiter tried %d times in 10s; want 3", counters[0].n.Load())
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
	for i, c := range counters[1:] {
		if got := c.n.Load(); got != 1 {
			t.Fatalf("waiter w%d behind the first ran %d permit statements; want 1", i+1, got)
		}
	}
	if err := holder.ReleaseShared(ctx, key, driver.SharedPermit, "holder"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		got = append(got, <-order)
	}
	if want := "[w0 w1 w2 w3 w4]"; fmt.Sprint(got) != want {
		t.Fatalf("granted in the order %v; want the arrival order %s", got, want)
	}
	if h, w := gateState(t, ctx, holder, key); h+w != 0 {
		t.Fatalf("gate held by %d, waited for by %d after every wait; want none", h, w)
	}
}

// In advisory mode a waiter that crashes while it holds a semaphore's gate
// (its session ends) does not block the waiters behind it: a session takes
// the gate and is terminated; the live waiter queued behind it is then
// granted the free permit.
func TestSharedAdvisoryCrashedWaiterDoesNotBlock(t *testing.T) {
	ctx := ctxFor(t, time.Minute)
	l := openT(t, serverURL(t))
	key := fmt.Sprintf("gatecrash/%d", time.Now().UnixNano())
	dead, err := pgx.Connect(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close(context.Background())
	var pid int32
	if err := dead.QueryRow(ctx, `SELECT pg_backend_pid() FROM (SELECT pg_advisory_lock($1)) x`,
		sharedAdv(l.adv.ns, driver.SharedPermit, key)+permitGate).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	granted := make(chan error, 1)
	go func() {
		_, err := l.AcquireShared(ctx, key, sreq(driver.SharedPermit, "live", time.Minute, 1, true))
		granted <- err
	}()
	waitGate(t, ctx, l, key, 1)
	if _, err := l.adv.pool.Exec(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-granted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the live waiter was not granted within 10s of the gate holder's end")
	}
}
