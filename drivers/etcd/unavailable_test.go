package etcd

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/etcdtest"
)

// unavailQuery makes calls to an unreachable cluster fail fast.
const unavailQuery = "?request_timeout=1s&dial_timeout=1s"

// expectUnavailable checks that every call of d (and of the root Locker on
// it) on a cluster that cannot serve fails with ErrUnavailable within the
// request timeout, and is not taken for "held by another". (locker's
// ErrUnavailable is driver.ErrUnavailable.) held is a key
// d's owner "holder" holds.
func expectUnavailable(t *testing.T, d *Locker, held string) {
	t.Helper()
	ctx := testCtx(t)
	check := func(what string, call func() error) {
		t.Helper()
		start := time.Now()
		err := call()
		el := time.Since(start)
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("%s: %v, want ErrUnavailable only", what, err)
		}
		if el > 5*time.Second {
			t.Errorf("%s took %v with request_timeout=1s", what, el)
		}
		t.Logf("%s: %v after %v", what, err, el.Round(time.Millisecond))
	}
	check("Acquire", func() error { _, err := d.Acquire(ctx, "free", "o", 2*time.Second); return err })
	check("Acquire of a held key", func() error { _, err := d.Acquire(ctx, held, "other", 2*time.Second); return err })
	check("Refresh", func() error { return d.Refresh(ctx, held, "holder", 2*time.Second) })
	check("Release", func() error { return d.Release(ctx, held, "holder") })
	check("Inspect", func() error { _, err := d.Inspect(ctx, held); return err })
	check("Ping", func() error { return d.Ping(ctx) })
	l := locker.New(d)
	check("locker TryAcquire", func() error { _, err := l.TryAcquire(ctx, "free2"); return err })
}

// heldBy takes key for owner "holder" on d and checks that another owner
// is told ErrNotAcquired, not ErrUnavailable, while the cluster serves.
func heldBy(t *testing.T, d *Locker, key string) {
	t.Helper()
	ctx := testCtx(t)
	if _, err := d.Acquire(ctx, key, "holder", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	_, err := d.Acquire(ctx, key, "other", 2*time.Second)
	if !errors.Is(err, driver.ErrNotAcquired) || errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Acquire of a held key: %v, want ErrNotAcquired only", err)
	}
}

func openURL(t *testing.T, url string) *Locker {
	t.Helper()
	d, err := Driver{}.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.(*Locker)
}

// The only server is stopped: connections are refused.
func TestUnavailableServerStopped(t *testing.T) {
	c := etcdtest.Start(t)
	d := openURL(t, c.URL("/stopped"+unavailQuery))
	heldBy(t, d, "k")
	c.Members[0].Stop()
	expectUnavailable(t, d, "k")
}

// The server is partitioned away: a proxy in front of it drops every byte.
func TestUnavailablePartitioned(t *testing.T) {
	p, err := faultproxy.New(strings.TrimPrefix(testURL(t), "etcd://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	d := openURL(t, "etcd://"+p.Addr()+uniquePrefix(t)+unavailQuery)
	heldBy(t, d, "k")
	p.Blackhole()
	expectUnavailable(t, d, "k")
	p.Heal()
	// (The Release above timed out, but the proxy delivers it now: a
	// request that timed out may still be applied.)
	if err := d.Ping(testCtx(t)); err != nil {
		t.Fatalf("after the partition healed: %v", err)
	}
}

// Two members of three are stopped: the last one has no quorum.
func TestUnavailableNoQuorum(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	d := openURL(t, c.URL("/quorum"+unavailQuery))
	heldBy(t, d, "k")
	c.Members[1].Stop()
	c.Members[2].Stop()
	expectUnavailable(t, d, "k")
}

// A client that speaks TLS to a plaintext server fails its handshake.
func TestUnavailableTLSHandshake(t *testing.T) {
	d := openURL(t, testURL(t)+uniquePrefix(t)+unavailQuery+"&tls=true&insecure_skip_verify=true")
	expectUnavailable(t, d, "k")
}

// On a cluster with authentication on, wrong credentials fail Open, and
// none fail every call; right ones work.
func TestUnavailableAuth(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.Client(t)
	ctx := testCtx(t)
	if _, err := cli.UserAdd(ctx, "root", "secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	host := strings.TrimPrefix(c.URL(""), "etcd://")
	// Checking a password (bcrypt) takes over a second under -race on a
	// loaded machine: give authentication time, so that the refusal, not a
	// timeout, is what is tested.
	const authQuery = "?request_timeout=10s&dial_timeout=10s"
	_, err := Driver{}.Open("etcd://root:wrong@" + host + "/auth" + authQuery)
	if !errors.Is(err, driver.ErrUnavailable) || !strings.Contains(err.Error(), "authentication failed") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("Open with a wrong password: %v, want ErrUnavailable without the password", err)
	}
	anon := openURL(t, "etcd://"+host+"/auth"+authQuery)
	if _, err := anon.Acquire(ctx, "k", "o", 2*time.Second); !errors.Is(err, driver.ErrUnavailable) {
		t.Fatalf("Acquire without credentials: %v, want ErrUnavailable", err)
	}
	ok := openURL(t, "etcd://root:secret@"+host+"/auth"+authQuery)
	heldBy(t, ok, "k")
}
