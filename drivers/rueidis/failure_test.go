package rueidis

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// Killing the server while a lock is held makes the holder's Lost fire (its
// renewals fail until the safe deadline passes), and after a restart with
// no data the tokens keep increasing (the TIME floor).
func TestKillRestartWhileHeld(t *testing.T) {
	s := redistest.Start(t)
	l := locker.New(openT(t, urlOf(s.Addr)))
	ctx := ctxT(t, 60*time.Second)
	const ttl = time.Second
	lk, err := l.Acquire(ctx, "crash", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	first := lk.Token()
	killed := time.Now()
	s.Kill()
	select {
	case <-lk.Lost():
		if e := time.Since(killed); e > ttl+5*time.Second {
			t.Errorf("Lost fired %v after the kill, want about the TTL (%v)", e, ttl)
		}
	case <-time.After(ttl + 20*time.Second):
		t.Fatal("Lost did not fire after the server was killed")
	}
	s.Restart()
	var lk2 *locker.Lock
	drivertest.WaitFor(t, 20*time.Second, "acquire after restart", func() bool {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		lk2, err = l.TryAcquire(c, "crash", locker.WithTTL(ttl))
		return err == nil
	})
	if lk2.Token() <= first {
		t.Fatalf("token after restart %d <= token before %d", lk2.Token(), first)
	}
	if err := lk2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lk3, err := l.TryAcquire(ctx, "crash", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if lk3.Token() <= lk2.Token() {
		t.Fatalf("token %d <= previous %d", lk3.Token(), lk2.Token())
	}
	_ = lk3.Release(ctx)
}

// The counter key is lost (deleted, or expired after token_retention) but
// tokens still increase.
func TestTokensSurviveLostCounter(t *testing.T) {
	s := redistest.Start(t)
	d := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	var last uint64
	for i := range 5 {
		o := newOwner()
		tok, err := d.Acquire(ctx, "ctr", o, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("grant %d: token %d <= previous %d", i, tok, last)
		}
		last = tok
		if err := d.Release(ctx, "ctr", o); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Do("FLUSHALL"); err != nil {
			t.Fatal(err)
		}
	}
	// Counters expire: the counter key has a TTL.
	o := newOwner()
	if _, err := d.Acquire(ctx, "ctr", o, time.Second); err != nil {
		t.Fatal(err)
	}
	_, counter, _ := keysOf(d, "ctr")
	v, err := s.Do("PTTL", counter)
	if err != nil {
		t.Fatal(err)
	}
	if pttl, _ := v.(int64); pttl <= 0 {
		t.Fatalf("counter key %s has PTTL %v, want a TTL (counters must not pile up)", counter, v)
	}
}

// The scripts are run by SHA and reloaded after SCRIPT FLUSH (NOSCRIPT).
func TestScriptReloadAfterFlush(t *testing.T) {
	s := redistest.Start(t)
	d := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	o := newOwner()
	if _, err := d.Acquire(ctx, "ns", o, time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Do("SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, "ns", o); err != nil {
		t.Fatalf("release after SCRIPT FLUSH: %v", err)
	}
	evalsha := cmdCalls(t, s, "evalsha")
	if _, err := d.Acquire(ctx, "ns", o, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := cmdCalls(t, s, "evalsha") - evalsha; got != 1 {
		t.Fatalf("acquire made %d EVALSHA calls, want 1", got)
	}
}

func keysOf(l *Locker, key string) (lock, counter, channel string) {
	return keysFor(rediscore.DefaultPrefix, key)
}

// Bad input: each case gets a clear error naming the cause, before or at
// Open, and nothing is left behind.
func TestOpenErrors(t *testing.T) {
	s := redistest.Start(t)
	// (redistest's readiness PING has no AUTH, so the password is set after.)
	if _, err := s.Do("CONFIG", "SET", "requirepass", "secret"); err != nil {
		t.Fatal(err)
	}
	free := redistest.RefusedPort(t)
	// A port that accepts TCP but does not speak Redis (it answers HTTP).
	notRedis := drivertest.NotRedis(t)
	// A port that accepts TCP and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	sn := redistest.StartSentinel(t)

	cases := []struct {
		name, dsn, want string
		invalid         bool
	}{
		{"unreachable", urlOf("127.0.0.1:" + itoa(free)), "unreachable", false},
		{"wrong password", "rueidis://:wrong@" + s.Addr, "authentication failed", false},
		{"no password", "rueidis://" + s.Addr, "NOAUTH", false},
		{"not redis", urlOf(notRedis) + "?dial_timeout=2s", "not a Redis server", false},
		{"silent port", urlOf(silent.Addr().String()) + "?dial_timeout=500ms", "not a Redis server", false},
		{"replica", urlOf(sn.Replica.Addr), "is a replica", true},
		{"cluster and sentinel", urlOf(s.Addr) + "?cluster=true&sentinel_master=m", "mutually exclusive", true},
		{"unknown parameter", urlOf(s.Addr) + "?pool_size=3", "unknown query parameter", true},
		{"cluster on a single node", "rueidis://:secret@" + s.Addr + "?cluster=true", "not a Redis Cluster", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := Open(context.Background(), c.dsn)
			if err == nil {
				l.Close()
				t.Fatalf("Open(%q) succeeded", c.dsn)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Open(%q) = %v, want an error containing %q", c.dsn, err, c.want)
			}
			if errors.Is(err, driver.ErrInvalid) != c.invalid {
				t.Fatalf("Open(%q) = %v: errors.Is(ErrInvalid) = %v, want %v", c.dsn, err, !c.invalid, c.invalid)
			}
			if strings.Contains(err.Error(), "wrong") && c.name == "wrong password" && strings.Contains(err.Error(), ":wrong@") {
				t.Fatalf("error leaks the password: %v", err)
			}
			t.Logf("%v", err)
		})
	}
	// allow_replica=true turns the replica check off.
	l, err := Open(context.Background(), urlOf(sn.Replica.Addr)+"?allow_replica=true")
	if err != nil {
		t.Fatalf("allow_replica=true: %v", err)
	}
	l.Close()

	// The right password works.
	d := openT(t, "rueidis://:secret@"+s.Addr)
	ctx := ctxT(t, 30*time.Second)
	if err := d.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// A key over max_key_len is rejected before any I/O.
	long := strings.Repeat("k", rediscore.DefaultMaxKeyLen+1)
	if _, err := d.Acquire(ctx, long, newOwner(), time.Second); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("acquire with a %d-byte key: %v, want ErrInvalid", len(long), err)
	}
	if _, _, err := d.Subscribe(ctx, long); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("subscribe with a %d-byte key: %v, want ErrInvalid", len(long), err)
	}
}

func keysFor(prefix, key string) (lock, counter, channel string) {
	return rediscore.Keys(prefix, key)
}
