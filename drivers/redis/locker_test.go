package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

func TestRegistered(t *testing.T) {
	s := redistest.Start(t)
	for _, scheme := range []string{"redis", "rediss"} {
		found := false
		for _, d := range locker.Drivers() {
			found = found || d == scheme
		}
		if !found {
			t.Fatalf("scheme %q not registered: %v", scheme, locker.Drivers())
		}
	}
	l, err := locker.OpenURL(s.URL() + "?prefix=app")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lk, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Do("EXISTS", "app:{k}"); v != int64(1) {
		t.Fatal("lock key app:{k} not written")
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestOpenErrors(t *testing.T) {
	unreachable := "127.0.0.1:" + itoa(redistest.RefusedPort(t))

	pw := redistest.Start(t, "--requirepass", "right")

	// A port that speaks something else than Redis.
	notRedis := drivertest.NotRedis(t)

	master := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", itoa(master.Port))
	tlsOnly := redistest.StartTLS(t)

	for name, tc := range map[string]struct {
		dsn, want string
		invalid   bool
	}{
		"unreachable":     {"redis://" + unreachable + "?dial_timeout=2s", "server unreachable", false},
		"wrong password":  {"redis://:s3cr3t@" + pw.Addr, "authentication failed", false},
		"no password":     {"redis://" + pw.Addr, "authentication failed", false},
		"not redis":       {"redis://" + notRedis, "is this a Redis server", false},
		"replica":         {"redis://" + replica.Addr, "is a replica (ROLE slave of 127.0.0.1:" + itoa(master.Port) + "), not a master", true},
		"redlock replica": {"redis://" + master.Addr + "," + replica.Addr + "," + pw.Addr, "not a master", true},
		"both modes":      {"redis://" + master.Addr + "?cluster=true&sentinel_master=m", "mutually exclusive", true},
		"untrusted cert":  {"rediss://" + tlsOnly.Addr, "TLS handshake failed", false},
		"plain to TLS":    {"redis://" + tlsOnly.Addr, "needs rediss://", false},
	} {
		start := time.Now()
		l, err := Open(context.Background(), tc.dsn)
		if err == nil {
			l.Close()
			t.Errorf("%s: Open succeeded", name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || errors.Is(err, driver.ErrInvalid) != tc.invalid {
			t.Errorf("%s: %v; want %q (ErrInvalid %v)", name, err, tc.want, tc.invalid)
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%s: error leaks the password: %v", name, err)
		}
		if d := time.Since(start); d > 15*time.Second {
			t.Errorf("%s: Open took %v", name, d)
		}
		t.Logf("%s: %v", name, err)
	}
	// allow_replica opts out of the check.
	l, err := Open(context.Background(), "redis://"+replica.Addr+"?allow_replica=true")
	if err != nil {
		t.Fatalf("allow_replica: %v", err)
	}
	l.Close()
	// The right password works.
	l, err = Open(context.Background(), "redis://:right@"+pw.Addr)
	if err != nil {
		t.Fatalf("right password: %v", err)
	}
	l.Close()
}

func TestKeyTooLong(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL()+"?max_key_len=16")
	ctx := context.Background()
	_, err := l.Acquire(ctx, strings.Repeat("k", 17), "o", time.Second)
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "max_key_len 16") {
		t.Fatalf("long key: %v", err)
	}
	if _, _, err := l.Subscribe(ctx, strings.Repeat("k", 17)); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("subscribe long key: %v", err)
	}
	if _, err := l.Acquire(ctx, strings.Repeat("k", 16), "o", time.Second); err != nil {
		t.Fatal(err)
	}
}

// The constructors' shape: New and NewRedlock take a ctx and a *Options,
// nil meaning every default; bad options or clients are driver.ErrInvalid
// before any I/O; Open rejects an unknown parameter before any I/O.
func TestNewValidates(t *testing.T) {
	ctx := context.Background()
	if _, err := New(ctx, nil, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatal(err)
	}
	// The adopted client points at a port nothing listens on: an error
	// other than ErrInvalid would mean New tried I/O.
	down := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:" + itoa(redistest.RefusedPort(t)), MaxRetries: -1})
	defer down.Close()
	for name, o := range map[string]*Options{
		"prefix":          {Prefix: "a{"},
		"node_timeout":    {NodeTimeout: -time.Second},
		"drift_factor":    {DriftFactor: 0.5},
		"max_key_len":     {MaxKeyLen: -1},
		"token_retention": {TokenRetention: -time.Second},
		"queue_ttl":       {QueueTTL: time.Millisecond},
	} {
		_, err := New(ctx, down, o)
		if !errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrUnavailable) || !strings.HasPrefix(err.Error(), "redis: "+name) {
			t.Errorf("New with bad %s: %v", name, err)
		}
		if _, err := NewRedlock(ctx, []goredis.UniversalClient{down, down}, o); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("NewRedlock with bad %s: %v", name, err)
		}
	}
	if _, err := NewRedlock(ctx, []goredis.UniversalClient{down}, nil); !errors.Is(err, driver.ErrInvalid) {
		t.Fatal(err)
	}
	if _, err := Open(ctx, "redis://127.0.0.1:"+itoa(redistest.RefusedPort(t))+"?bogus=1"); !errors.Is(err, driver.ErrInvalid) ||
		!strings.Contains(err.Error(), "unknown query parameter(s) bogus") {
		t.Fatalf("Open with an unknown parameter: %v", err)
	}

	// nil Options: the defaults, on a working server.
	s := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c.Close()
	l, err := New(ctx, c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, _ := s.Do("EXISTS", "locker:{k}"); v != int64(1) {
		t.Fatalf("nil Options: the lock is not under the default prefix (EXISTS = %v)", v)
	}
	c2 := goredis.NewClient(&goredis.Options{Addr: redistest.Start(t).Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer c2.Close()
	rl, err := NewRedlock(ctx, []goredis.UniversalClient{c, c2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := rl.Capabilities().MinTTL; got != 300*time.Millisecond {
		t.Fatalf("NewRedlock with nil Options: MinTTL %v, want 3 × the default node timeout", got)
	}
	rl.Close()
	// New does not close the adopted client.
	l.Close()
	if err := c.Ping(context.Background()).Err(); errors.Is(err, goredis.ErrClosed) {
		t.Fatal("Close closed the adopted client")
	}
}

// Kill the server while a lock is held: the holder's Lost() fires; after a
// restart (empty), tokens keep increasing.
func TestServerRestartWhileHeld(t *testing.T) {
	s := redistest.Start(t)
	l, err := locker.OpenURL(s.URL() + "?read_timeout=200ms&dial_timeout=200ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	tok := lk.Token()
	s.Kill()
	start := time.Now()
	select {
	case <-lk.Lost():
		// The holder must learn before the TTL could have run out.
		if d := time.Since(start); d > ttl {
			t.Logf("Lost after %v (TTL %v)", d, ttl)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Lost() did not fire after the server was killed")
	}
	s.Restart()
	var lk2 *locker.Lock
	drivertest.WaitFor(t, 20*time.Second, "acquire after restart", func() bool {
		lk2, err = l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute))
		return err == nil
	})
	if lk2.Token() <= tok {
		t.Fatalf("token after restart %d, want > %d", lk2.Token(), tok)
	}
	_ = lk2.Release(ctx)
}

// Redlock over five servers: works with two killed, refuses (no grant, a
// clear error) with three killed.
func TestRedlockFailures(t *testing.T) {
	ms := redistest.StartN(t, 5)
	addrs := redistest.Addrs(ms)
	dsn := urlOf(addrs...) + "?node_timeout=300ms&dial_timeout=300ms"
	l, err := locker.OpenURL(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	ms[0].Kill()
	ms[3].Stop() // frozen, not refused: the per-node timeout bounds it
	defer ms[3].Cont()
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(5*time.Second))
	if err != nil {
		t.Fatalf("acquire with 2 of 5 down: %v", err)
	}
	tok := lk.Token()
	if err := lk.Refresh(ctx, 5*time.Second); err != nil {
		t.Fatalf("refresh with 2 of 5 down: %v", err)
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatalf("release with 2 of 5 down: %v", err)
	}
	// A second locker contends and waits while a quorum is up.
	lk, err = l.TryAcquire(ctx, "k", locker.WithTTL(5*time.Second))
	if err != nil || lk.Token() <= tok {
		t.Fatalf("re-acquire: %v, token %d after %d", err, lk.Token(), tok)
	}
	_ = lk.Release(ctx)

	ms[1].Kill()
	_, err = l.TryAcquire(ctx, "k2", locker.WithTTL(5*time.Second))
	if err == nil || errors.Is(err, locker.ErrNotAcquired) || !strings.Contains(err.Error(), "no quorum") {
		t.Fatalf("acquire with 3 of 5 down = %v; want a no-quorum error", err)
	}
	t.Log(err)
	for _, m := range []*redistest.Server{ms[2], ms[4]} {
		if v, _ := m.Do("EXISTS", "locker:{k2}"); v != int64(0) {
			t.Fatalf("%s: failed acquire left the lock behind", m.Addr)
		}
	}
	// Open itself refuses a URL whose quorum is unreachable.
	if _, err := Open(context.Background(), dsn); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("Open with 3 of 5 down = %v", err)
	}
}

// A cancelled acquire (server frozen, ctx deadline) leaves nothing held
// once the server resumes.
func TestCancelledAcquireLeavesNothing(t *testing.T) {
	s := redistest.Start(t)
	l := openT(t, s.URL())
	if err := l.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire = %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("acquire returned %v after its deadline", d)
	}
	s.Cont()
	drivertest.WaitFor(t, 20*time.Second, "no lock left behind", func() bool {
		v, _ := s.Do("EXISTS", "locker:{k}")
		return v == int64(0)
	})
}

// A crashed holder (it never renews nor releases) is taken over when its
// TTL runs out, through the PTTL Acquire reports, not after package
// locker's fallback timer (at least 1.6s).
func TestCrashedHolderTakenOverAtTTL(t *testing.T) {
	s := redistest.Start(t)
	crashed := openT(t, s.URL())
	l, err := locker.OpenURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	start := time.Now()
	if _, err := crashed.Acquire(ctx, "k", "crashed", ttl); err != nil {
		t.Fatal(err)
	}
	lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	d := time.Since(start)
	t.Logf("taken over %v after the crashed holder's grant (TTL %v)", d, ttl)
	if d < ttl-2*time.Millisecond {
		t.Fatalf("taken over after %v, before the TTL %v", d, ttl)
	}
	// Without the wake-up at the PTTL, package locker's fallback timer
	// (at least 1.6s) would be what retries.
	if d > ttl+100*time.Millisecond {
		t.Fatalf("taken over after %v, more than 100ms after the TTL %v", d, ttl)
	}
}

// Sentinel: the driver follows the master the sentinel names; after a
// failover (master killed, replica promoted) locks work again and tokens
// keep increasing.
func TestSentinelFailover(t *testing.T) {
	sn := redistest.StartSentinel(t)
	l, err := locker.OpenURL(urlOf(sn.Sentinel.Addr) + "?sentinel_master=" + sn.Name + "&dial_timeout=500ms&read_timeout=500ms")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	tok := lk.Token()
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Wait until the replica has the counter, then fail over.
	drivertest.WaitFor(t, 20*time.Second, "replication of the counter", func() bool {
		v, _ := sn.Replica.Do("EXISTS", "locker:{k}:token")
		return v == int64(1)
	})
	sn.Master.Kill()
	var lk2 *locker.Lock
	drivertest.WaitFor(t, 60*time.Second, "a lock after failover", func() bool {
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		lk2, err = l.TryAcquire(c, "k", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
		return err == nil
	})
	if lk2.Token() <= tok {
		t.Fatalf("token after failover %d, want > %d", lk2.Token(), tok)
	}
	if v, _ := sn.Replica.Do("ROLE"); v.([]any)[0] != "master" {
		t.Fatalf("replica role after failover: %v", v)
	}
	_ = lk2.Release(ctx)
}

// Open's start-up check is bounded by ctx: a done ctx fails before any
// I/O, and a deadline cuts short the check of servers that accept
// connections but do not answer (stopped), long before dial_timeout +
// read_timeout.
func TestOpenContext(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, s.URL()); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled ctx: %v", err)
	}
	if _, err := Open(ctx, s.URL()+"?bogus=1"); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open of a bad URL with a cancelled ctx: %v", err)
	}
	s2 := redistest.Start(t)
	for _, x := range []*redistest.Server{s, s2} {
		x.Stop()
		t.Cleanup(x.Cont)
	}
	// One server, and a Redlock of which only one master of three answers.
	for _, dsn := range []string{s.URL(), urlOf(s.Addr, s2.Addr, redistest.Start(t).Addr)} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		l, err := Open(ctx, dsn+"?dial_timeout=20s&read_timeout=20s")
		cancel()
		if err == nil {
			l.Close()
			t.Fatalf("%s: Open succeeded on a stopped server", dsn)
		}
		if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d > 5*time.Second {
			t.Fatalf("%s: Open = %v after %v; want context.DeadlineExceeded soon after 300ms", dsn, err, d)
		}
	}
}

// Calls without a deadline or a cancellation on a frozen server end within
// go-redis's read_timeout (3s by default), with an error: the bound the
// driver reports as rediscore.TimedConn, on which an acquire that outlives
// its caller relies instead of a deadline of its own.
func TestCallsBoundedOnFrozenServer(t *testing.T) {
	s := redistest.Start(t)
	for _, c := range []struct {
		read time.Duration
		want bool
	}{{0, true}, {-1, false}} { // 0: go-redis's default, 3s; -1: no timeout
		cl := goredis.NewClient(&goredis.Options{Addr: s.Addr, ReadTimeout: c.read})
		if got := (&conn{c: cl}).Timed(); got != c.want {
			t.Errorf("ReadTimeout %v: Timed() = %v, want %v", c.read, got, c.want)
		}
		cl.Close()
	}
	drivertest.CallsBounded(t, openT(t, urlOf(s.Addr)), s, 3*time.Second+3*time.Second) // read_timeout, and slack for a loaded machine
}
