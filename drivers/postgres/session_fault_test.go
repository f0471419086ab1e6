package postgres

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// lostBound is how soon after a fault that ends the holder's session its
// Lost() must close (the package documentation and the README quote it).
const lostBound = 100 * time.Millisecond

// halfOpenBound is how soon after the server ends a session whose client
// side stays open and silent (a half-open connection) the holder's Lost()
// must close: the session probe (probe.go) finds it within one probe
// interval plus, when the probe's own connection is half-open too, one
// probe timeout and a reconnection.
const halfOpenBound = time.Second

// faultTTL is the TTL of the session-fault tests: long enough that a grant
// before it can only come from the session's end, not from expiry.
const faultTTL = 6 * time.Second

// fencedRegister stands for a resource that checks fencing tokens: it
// accepts a write only if its token is at least the highest it has seen.
type fencedRegister struct {
	mu       sync.Mutex
	highest  uint64
	accepted []fencedWrite
	rejected map[string]int
}

type fencedWrite struct {
	who   string
	token uint64
}

func (r *fencedRegister) write(who string, token uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token < r.highest {
		if r.rejected == nil {
			r.rejected = map[string]int{}
		}
		r.rejected[who]++
		return false
	}
	r.highest = token
	r.accepted = append(r.accepted, fencedWrite{who, token})
	return true
}

// check fails the test if any write was accepted after a write with a
// higher token, or if the holder wrote after the waiter.
func (r *fencedRegister) check(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	waiterSeen := false
	var prev uint64
	for i, w := range r.accepted {
		if w.token < prev {
			t.Fatalf("write %d (%s, token %d) accepted after token %d", i, w.who, w.token, prev)
		}
		prev = w.token
		if w.who == "waiter" {
			waiterSeen = true
		} else if waiterSeen {
			t.Fatalf("stale write by the old holder (token %d) accepted after the new holder's", w.token)
		}
	}
	if !waiterSeen {
		t.Fatal("the new holder never wrote")
	}
	t.Logf("fenced register: %d writes accepted, rejected %v", len(r.accepted), r.rejected)
}

// sessionFault is one way the holder's session ends without the idle timer.
type sessionFault struct {
	// holderURL and waiterURL connect the two Lockers.
	holderURL, waiterURL string
	// monitor is a pool on the server for looking at pg_locks.
	monitor *pgx.Conn
	// inject makes the fault happen; the clock starts just before it.
	inject func(t *testing.T, key string)
	// recover, if set, runs after inject (a restart).
	recover func(t *testing.T)
	// grantBound bounds the time from the fault to the waiter's grant.
	grantBound time.Duration
	// lostBound bounds the time from the fault to the holder's Lost()
	// (zero: the package's lostBound).
	lostBound time.Duration
}

// runSessionFault takes a lock in one Locker, has a second Locker wait for
// it in Acquire, injects the fault and measures: the holder's Lost() must
// close within f.lostBound (default lostBound) of the fault, and so at most
// that long after the waiter's grant; the waiter's grant comes within
// grantBound with a higher token; and a fenced register fed by both never
// accepts the old holder's write after the new holder's.
func runSessionFault(t *testing.T, f sessionFault) {
	if f.lostBound == 0 {
		f.lostBound = lostBound
	}
	ctx := ctxFor(t, 2*time.Minute)
	key := fmt.Sprintf("fault/%s/%d", t.Name(), time.Now().UnixNano())
	holder := locker.New(openT(t, f.holderURL))
	defer holder.Close()
	waiter := locker.New(openT(t, f.waiterURL))
	defer waiter.Close()
	lk, err := holder.TryAcquire(ctx, key, locker.WithTTL(faultTTL))
	if err != nil {
		t.Fatal(err)
	}
	reg := &fencedRegister{}

	// The holder writes until it learns it lost the lock.
	holderDone := make(chan struct{})
	go func() {
		defer close(holderDone)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-lk.Lost():
				return
			case <-tick.C:
				reg.write("holder", lk.Token())
			}
		}
	}()

	// The waiter blocks in Acquire (in the server's lock manager); if the
	// fault kills its session too, it tries again until it is granted.
	type grant struct {
		at    time.Time
		token uint64
		err   error
	}
	granted := make(chan grant, 1)
	go func() {
		for {
			lk2, err := waiter.Acquire(ctx, key, locker.WithTTL(faultTTL))
			if err != nil && ctx.Err() == nil {
				// The server was down when the waiter (re)connected:
				// Acquire's first attempt fails fast. Try again.
				select {
				case <-time.After(20 * time.Millisecond):
				case <-ctx.Done():
				}
				continue
			}
			if err != nil {
				granted <- grant{err: err}
				return
			}
			g := grant{at: time.Now(), token: lk2.Token()}
			reg.write("waiter", lk2.Token())
			_ = lk2.Release(ctx)
			granted <- g
			return
		}
	}()
	waitForWaiter(t, f.monitor, key)

	lostCh := make(chan time.Time, 1)
	go func() {
		select {
		case <-lk.Lost():
			lostCh <- time.Now()
		case <-ctx.Done():
		}
	}()
	faultAt := time.Now()
	f.inject(t, key)
	if f.recover != nil {
		f.recover(t)
	}
	var lostAt time.Time
	select {
	case lostAt = <-lostCh:
	case <-time.After(faultTTL):
		t.Fatalf("Lost() did not close within the TTL (%v) of the fault", faultTTL)
	}
	<-holderDone
	var g grant
	select {
	case g = <-granted:
	case <-ctx.Done():
		t.Fatal("the waiter was never granted the lock")
	}
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	lostAfter, grantAfter := lostAt.Sub(faultAt), g.at.Sub(faultAt)
	t.Logf("after the fault: holder's Lost() %v, waiter granted %v (token %d → %d); Lost() %v after the grant",
		lostAfter, grantAfter, lk.Token(), g.token, lostAt.Sub(g.at))
	if lostAfter > f.lostBound {
		t.Errorf("Lost() closed %v after the fault, want within %v", lostAfter, f.lostBound)
	}
	if gap := lostAt.Sub(g.at); gap > f.lostBound {
		t.Errorf("Lost() closed %v after the waiter's grant, want within %v", gap, f.lostBound)
	}
	if grantAfter > f.grantBound {
		t.Errorf("waiter granted %v after the fault, want within %v", grantAfter, f.grantBound)
	}
	if g.token <= lk.Token() {
		t.Errorf("new token %d not above the old %d", g.token, lk.Token())
	}
	reg.check(t)
}

// waitForWaiter returns once a session is queued for key's advisory lock.
func waitForWaiter(t *testing.T, c *pgx.Conn, key string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if queuedFor(t, c, key) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued in the server")
		}
		time.Sleep(5 * time.Millisecond) // polling the server is the check
	}
}

func monitorConn(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctxFor(t, 30*time.Second), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// (a) pg_terminate_backend of the holder's backend.
func TestSessionFaultTerminate(t *testing.T) {
	url := serverURL(t)
	mon := monitorConn(t, url)
	runSessionFault(t, sessionFault{
		holderURL: url, waiterURL: url, monitor: mon,
		inject: func(t *testing.T, key string) {
			pid := holderPIDConn(t, mon, key)
			var ok bool
			if err := mon.QueryRow(ctxFor(t, 30*time.Second), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
				t.Fatalf("pg_terminate_backend: %v %v", ok, err)
			}
		},
		grantBound: faultTTL / 2,
	})
}

// (b) An unrelated backend is killed with SIGKILL: the postmaster ends every
// session and reinitializes shared memory, so the lock is gone; the waiter
// is granted once the server has recovered.
func TestSessionFaultOtherBackendKilled(t *testing.T) {
	srv := pgtest.Start(t)
	mon := monitorConn(t, srv.URL())
	victim := monitorConn(t, srv.URL())
	runSessionFault(t, sessionFault{
		holderURL: srv.URL(), waiterURL: srv.URL(), monitor: mon,
		inject: func(t *testing.T, key string) {
			if err := syscall.Kill(int(victim.PgConn().PID()), syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		},
		grantBound: 30 * time.Second, // crash recovery on a loaded machine
	})
}

// (c) The holder's connection is reset by something between it and the
// server (a proxy, a middlebox): both ends see a TCP reset, the backend
// exits and frees the lock.
func TestSessionFaultConnectionReset(t *testing.T) {
	url := serverURL(t)
	p, proxied := proxyFor(t, url)
	runSessionFault(t, sessionFault{
		holderURL: proxied, waiterURL: url, monitor: monitorConn(t, url),
		inject: func(t *testing.T, key string) {
			if n := p.Reset(); n == 0 {
				t.Fatal("no connection through the proxy to reset")
			}
		},
		grantBound: faultTTL / 2,
	})
}

// (e) A half-open connection: something between the holder and the server
// (a proxy whose backend connection died, an HA proxy failing over, a
// middlebox) resets only the server's side. The backend exits and frees the
// lock at once, so the waiter is granted; the holder's socket stays open
// and silent, so only a look from outside the session can tell the holder.
// Its Lost() must close within halfOpenBound of the reset (and so within
// halfOpenBound of the waiter's grant, which the reset precedes), long
// before the next renewal (TTL/3) could time out; the waiter's token is
// higher, and the fenced register accepts no write of the old holder after
// the new holder's.
func TestSessionFaultHalfOpen(t *testing.T) {
	url := serverURL(t)
	p, proxied := proxyFor(t, url)
	runSessionFault(t, sessionFault{
		holderURL: proxied, waiterURL: url, monitor: monitorConn(t, url),
		inject: func(t *testing.T, key string) {
			if n := p.ResetSide(faultproxy.Server); n == 0 {
				t.Fatal("no connection through the proxy to reset")
			}
		},
		grantBound: faultTTL / 2,
		lostBound:  halfOpenBound,
	})
}

// proxyFor starts a fault proxy in front of url's server and returns it
// with url rewritten to go through it.
func proxyFor(t *testing.T, url string) (*faultproxy.Proxy, string) {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	proxied, err := replaceHost(url, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return p, proxied
}

// (d) The server is restarted with an immediate shutdown while the lock is
// held.
func TestSessionFaultImmediateRestart(t *testing.T) {
	srv := pgtest.Start(t)
	runSessionFault(t, sessionFault{
		holderURL: srv.URL(), waiterURL: srv.URL(), monitor: monitorConn(t, srv.URL()),
		inject:     func(t *testing.T, key string) { srv.StopImmediate(t) },
		recover:    func(t *testing.T) { srv.Restart(t) },
		grantBound: 60 * time.Second,
	})
}

// replaceHost returns url with its host:port replaced by addr.
func replaceHost(raw, addr string) (string, error) {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "", err
	}
	u.Host = addr
	return u.String(), nil
}

// holderPIDConn returns the backend pid holding key's advisory lock.
func holderPIDConn(t *testing.T, c *pgx.Conn, key string) int {
	t.Helper()
	pid := holderPID(t, c, DefaultNamespace, key)
	if pid == 0 {
		t.Fatalf("no backend holds %q", key)
	}
	return pid
}

// While the session lives the watch never fires: not on the replies to
// renewals (TTL/3 apart), nor on the ParameterStatus messages a
// configuration reload adds. It is armed all along: terminating the backend
// afterwards closes Lost() at once.
func TestSessionWatchNoFalseAlarm(t *testing.T) {
	srv := pgtest.Start(t)
	ctx := ctxFor(t, time.Minute)
	mon := monitorConn(t, srv.URL())
	l := locker.New(openT(t, srv.URL()))
	defer l.Close()
	key := "no-false-alarm"
	lk, err := l.TryAcquire(ctx, key, locker.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mon.Exec(ctx, `ALTER SYSTEM SET DateStyle = 'SQL, DMY'`); err != nil {
		t.Fatal(err)
	}
	if _, err := mon.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Fatalf("Lost() closed while the session lived: %v", lk.Refresh(ctx, time.Second))
	case <-time.After(2 * time.Second): // ~6 renewals and the reload
	}
	// Renew every 10s from now on, so that only the watch can report the
	// end within the bound.
	if err := lk.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	pid := holderPIDConn(t, mon, key)
	start := time.Now()
	if _, err := mon.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Logf("Lost() %v after pg_terminate_backend", time.Since(start))
	case <-time.After(lostBound):
		t.Fatalf("Lost() did not close within %v of pg_terminate_backend", lostBound)
	}
}
