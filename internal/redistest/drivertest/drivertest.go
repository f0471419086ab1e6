// Package drivertest holds the scenarios both Redis drivers run against
// real servers for Open's eviction check and for driver.ErrUnavailable;
// each driver supplies how its URLs are spelled.
package drivertest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// URLs spells a driver's URLs.
type URLs struct {
	// Of is the URL of a single server (one address) or of several hosts.
	Of func(addrs ...string) string
	// Password is the URL of addr with a password.
	Password func(pw, addr string) string
	// TLS is the URL of a TLS-only server at addr, with certificate
	// verification on.
	TLS func(addr string) string
	// FastFail are query parameters bounding connecting and reading, so
	// that a dead server is reported well within the tests' deadlines.
	FastFail string
}

// With appends query parameters to a URL.
func With(u string, params ...string) string {
	for _, p := range params {
		if strings.Contains(u, "?") {
			u += "&" + p
		} else {
			u += "?" + p
		}
	}
	return u
}

// Open opens u through package locker, closed at the end of the test.
func Open(t *testing.T, u string) *locker.Locker {
	t.Helper()
	l, err := locker.OpenURL(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// Eviction: a server whose maxmemory-policy can evict lock keys is refused
// at Open in every mode (single, CONFIG renamed away, Redlock, Cluster,
// Sentinel), with an error naming the policy and allow_eviction; with
// allow_eviction=true it is accepted; a bad allow_eviction is ErrInvalid.
func Eviction(t *testing.T, u URLs) {
	evict := func(s *redistest.Server) {
		if _, err := s.Do("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"); err != nil {
			t.Fatal(err)
		}
	}
	single := redistest.Start(t, "--maxmemory-policy", "allkeys-lru")
	// CONFIG renamed away, as managed services do: the policy is read
	// from INFO memory.
	noConfig := redistest.Start(t, "--maxmemory-policy", "volatile-ttl", "--rename-command", "CONFIG", "")
	rl := redistest.StartN(t, 3)
	evict(rl[1])
	c := redistest.StartCluster(t, 3)
	evict(c.Masters[2])
	sn := redistest.StartSentinel(t)
	evict(sn.Master)
	for mode, dsn := range map[string]string{
		"single":    u.Of(single.Addr),
		"no-config": u.Of(noConfig.Addr),
		"redlock":   u.Of(redistest.Addrs(rl)...),
		"cluster":   With(u.Of(c.Addrs()...), "cluster=true"),
		"sentinel":  With(u.Of(sn.Sentinel.Addr), "sentinel_master="+sn.Name),
	} {
		t.Run(mode, func(t *testing.T) {
			l, err := locker.OpenURL(dsn)
			if err == nil {
				l.Close()
				t.Fatal("Open accepted a server with an evicting maxmemory-policy")
			}
			want := "allkeys-lru"
			if mode == "no-config" {
				want = "volatile-ttl"
			}
			if !errors.Is(err, rediscore.ErrEvictionPolicy) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "allow_eviction=true") {
				t.Fatalf("Open = %v; want an error naming %s and allow_eviction=true", err, want)
			}
			l, err = locker.OpenURL(With(dsn, "allow_eviction=true"))
			if err != nil {
				t.Fatalf("Open with allow_eviction=true: %v", err)
			}
			l.Close()
		})
	}
	t.Run("bad value", func(t *testing.T) {
		if _, err := locker.OpenURL(With(u.Of("127.0.0.1:1"), "allow_eviction=maybe")); !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "allow_eviction") {
			t.Fatalf("Open with allow_eviction=maybe = %v, want ErrInvalid naming the parameter", err)
		}
	})
}

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

func wantUnavailable(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, locker.ErrUnavailable) || errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("%s = %v; want ErrUnavailable", what, err)
	}
	t.Logf("%s: %v", what, err)
}

func wantHeld(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, locker.ErrNotAcquired) || errors.Is(err, locker.ErrUnavailable) {
		t.Fatalf("%s = %v; want ErrNotAcquired only", what, err)
	}
}

// holdKey has another Locker take key for a minute.
func holdKey(t *testing.T, u, key string) {
	t.Helper()
	lk, err := Open(t, u).TryAcquire(context.Background(), key, locker.WithTTL(time.Minute), locker.WithAutoRenew(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lk.Release(context.Background()) })
}

// Unavailable: every mode, with its servers killed, fails Open and
// TryAcquire with ErrUnavailable, never ErrNotAcquired; a key another owner
// holds stays ErrNotAcquired while the backend is up (on Redlock, with a
// minority of nodes down).
func Unavailable(t *testing.T, u URLs) {
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		dsn := With(u.Of(s.Addr), u.FastFail)
		l := Open(t, dsn)
		holdKey(t, dsn, "held")
		wantHeld(t, "TryAcquire of a held key", tryAcquire(l, "held"))
		s.Kill()
		wantUnavailable(t, "TryAcquire, server killed", tryAcquire(l, "k"))
		_, err := locker.OpenURL(dsn)
		wantUnavailable(t, "Open, server killed", err)
	})
	t.Run("auth", func(t *testing.T) {
		s := redistest.Start(t, "--requirepass", "right")
		_, err := locker.OpenURL(With(u.Password("wrong", s.Addr), u.FastFail))
		wantUnavailable(t, "Open, wrong password", err)
		// The password changes under an open Locker, and every connection
		// is dropped: its next connection is refused.
		l := Open(t, With(u.Password("right", s.Addr), u.FastFail))
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		admin := goredis.NewClient(&goredis.Options{Addr: s.Addr, Password: "right", MaxRetries: -1})
		defer admin.Close()
		if err := admin.ConfigSet(context.Background(), "requirepass", "changed").Err(); err != nil {
			t.Fatal(err)
		}
		_ = admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err()
		wantUnavailable(t, "TryAcquire, password changed", tryAcquire(l, "k"))
	})
	t.Run("tls", func(t *testing.T) {
		s := redistest.StartTLS(t)
		_, err := locker.OpenURL(With(u.TLS(s.Addr), u.FastFail))
		wantUnavailable(t, "Open, untrusted certificate", err)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		dsn := With(u.Of(c.Addrs()...), "cluster=true", u.FastFail)
		l := Open(t, dsn)
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		for _, s := range c.Masters {
			s.Kill()
		}
		wantUnavailable(t, "TryAcquire, cluster killed", tryAcquire(l, "k"))
		_, err := locker.OpenURL(dsn)
		wantUnavailable(t, "Open, cluster killed", err)
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		dsn := With(u.Of(sn.Sentinel.Addr), "sentinel_master="+sn.Name, u.FastFail)
		l := Open(t, dsn)
		if err := tryAcquire(l, "k"); err != nil {
			t.Fatal(err)
		}
		sn.Master.Kill()
		sn.Replica.Kill()
		wantUnavailable(t, "TryAcquire, master and replica killed", tryAcquire(l, "k"))
		sn.Sentinel.Kill()
		_, err := locker.OpenURL(dsn)
		wantUnavailable(t, "Open, sentinel killed", err)
	})
	t.Run("redlock", func(t *testing.T) {
		ss := redistest.StartN(t, 3)
		dsn := With(u.Of(redistest.Addrs(ss)...), u.FastFail, "node_timeout=500ms")
		l := Open(t, dsn)
		holdKey(t, dsn, "held")
		ss[0].Kill()
		wantHeld(t, "TryAcquire of a key held on a quorum, one node down", tryAcquire(l, "held"))
		ss[1].Kill()
		wantUnavailable(t, "TryAcquire, 2 of 3 nodes killed", tryAcquire(l, "k"))
		_, err := locker.OpenURL(dsn)
		wantUnavailable(t, "Open, 2 of 3 nodes killed", err)
	})
}
