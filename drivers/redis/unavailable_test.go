package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
)

// fastFail bounds connecting and reading, so that a dead server is
// reported in well under the tests' deadlines.
const fastFail = "dial_timeout=1s&read_timeout=1s&write_timeout=1s"

// tryAcquire is one TryAcquire through package locker, bounded by 10s.
func tryAcquire(l *locker.Locker, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := l.TryAcquire(ctx, key, locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err == nil {
		_ = lk.Release(ctx)
	}
	return err
}

func openURL(t *testing.T, u string) *locker.Locker {
	t.Helper()
	l, err := locker.OpenURL(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, locker.ErrUnavailable) || errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("%s = %v; want ErrUnavailable", what, err)
	}
	t.Logf("%s: %v", what, err)
}

// Every mode, with its servers stopped: Open and TryAcquire fail with
// ErrUnavailable, never ErrNotAcquired; a key another owner holds stays
// ErrNotAcquired while the backend is up.
func TestErrUnavailable(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		l := openURL(t, urlOf(s.Addr)+"?"+fastFail)
		other := openURL(t, urlOf(s.Addr)+"?"+fastFail)
		lk, err := other.TryAcquire(context.Background(), "held", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(context.Background())
		if err := tryAcquire(l, "held"); !errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, locker.ErrUnavailable) {
			t.Fatalf("TryAcquire of a held key = %v; want ErrNotAcquired only", err)
		}
		s.Kill()
		wantUnavailable(t, "TryAcquire, server killed", tryAcquire(l, "k"))
		_, err = locker.OpenURL(urlOf(s.Addr) + "?" + fastFail)
		wantUnavailable(t, "Open, server killed", err)
	})
	t.Run("auth", func(t *testing.T) {
		s := redistest.Start(t, "--requirepass", "right")
		_, err := locker.OpenURL("redis://:wrong@" + s.Addr + "?" + fastFail)
		wantUnavailable(t, "Open, wrong password", err)
		// The password changes under an open Locker: its next connection
		// is refused.
		l := openURL(t, "redis://:right@"+s.Addr+"?"+fastFail)
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		admin := goredis.NewClient(&goredis.Options{Addr: s.Addr, Password: "right", MaxRetries: -1})
		defer admin.Close()
		if err := admin.ConfigSet(context.Background(), "requirepass", "changed").Err(); err != nil {
			t.Fatal(err)
		}
		// Drop every connection (the admin's own included).
		_ = admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err()
		wantUnavailable(t, "TryAcquire, password changed", tryAcquire(l, "k"))
	})
	t.Run("tls", func(t *testing.T) {
		s := redistest.StartTLS(t)
		_, err := locker.OpenURL("rediss://" + s.Addr + "?" + fastFail)
		wantUnavailable(t, "Open, untrusted certificate", err)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		u := urlOf(c.Addrs()...) + "?cluster=true&" + fastFail
		l := openURL(t, u)
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		for _, s := range c.Masters {
			s.Kill()
		}
		wantUnavailable(t, "TryAcquire, cluster killed", tryAcquire(l, "k"))
		_, err := locker.OpenURL(u)
		wantUnavailable(t, "Open, cluster killed", err)
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		u := urlOf(sn.Sentinel.Addr) + "?sentinel_master=" + sn.Name + "&" + fastFail
		l := openURL(t, u)
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		sn.Master.Kill()
		sn.Replica.Kill()
		wantUnavailable(t, "TryAcquire, master and replica killed", tryAcquire(l, "k"))
		sn.Sentinel.Kill()
		_, err := locker.OpenURL(u)
		wantUnavailable(t, "Open, sentinel killed", err)
	})
	t.Run("redlock", func(t *testing.T) {
		ss := redistest.StartN(t, 3)
		u := urlOf(redistest.Addrs(ss)...) + "?" + fastFail + "&node_timeout=500ms"
		l := openURL(t, u)
		other := openURL(t, u)
		lk, err := other.TryAcquire(context.Background(), "held", locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(context.Background())
		ss[0].Kill()
		// One node down, the key held on the other two: held, not
		// unavailable.
		if err := tryAcquire(l, "held"); !errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, locker.ErrUnavailable) {
			t.Fatalf("TryAcquire of a key held on a quorum, one node down = %v; want ErrNotAcquired only", err)
		}
		ss[1].Kill()
		wantUnavailable(t, "TryAcquire, 2 of 3 nodes killed", tryAcquire(l, "k"))
		_, err = locker.OpenURL(u)
		wantUnavailable(t, "Open, 2 of 3 nodes killed", err)
	})
}
