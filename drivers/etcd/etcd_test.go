package etcd

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/etcdtest"
)

// testURL returns the etcd URL (without path) the tests use: the
// LOCKER_TEST_ETCD_URL environment variable if set ("etcd://host:2379"),
// else a single-member etcd started in this process for the test.
func testURL(t testing.TB) string {
	t.Helper()
	if u := os.Getenv("LOCKER_TEST_ETCD_URL"); u != "" {
		return strings.TrimSuffix(u, "/")
	}
	return sharedServer(t)
}

var (
	sharedURL string
	sharedErr error
)

// TestMain starts one embedded etcd for the whole test binary (unless
// LOCKER_TEST_ETCD_URL is set), so that each test does not pay for a server
// start. A server that cannot be started fails every test that needs it.
func TestMain(m *testing.M) {
	var c *etcdtest.Cluster
	if os.Getenv("LOCKER_TEST_ETCD_URL") == "" {
		c, sharedErr = etcdtest.New(1)
		if sharedErr == nil {
			sharedURL = c.URL("")
		}
	}
	code := m.Run()
	if c != nil {
		c.Close()
	}
	os.Exit(code)
}

func sharedServer(t testing.TB) string {
	t.Helper()
	if sharedErr != nil {
		t.Fatalf("cannot start etcd: %v", sharedErr)
	}
	return sharedURL
}

// uniquePrefix returns a key prefix no other test uses.
func uniquePrefix(t testing.TB) string {
	return "/test/" + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + randHex(4)
}

// openTest opens a Locker on the test server with a prefix of its own.
func openTest(t testing.TB, query string) *Locker {
	t.Helper()
	d, err := Driver{}.Open(testURL(t) + uniquePrefix(t) + query)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d.(*Locker)
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestOpenCloseIdempotent(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Acquire(ctx, "k", "o", 2*time.Second); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
	if err := l.Ping(ctx); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
	if _, _, err := l.Subscribe(ctx, "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
}

func TestCapabilities(t *testing.T) {
	l := openTest(t, "?min_ttl=3s")
	c := l.Capabilities()
	if c.MinTTL != 3*time.Second || c.TTLGranularity != time.Second || !c.DurableTokens {
		t.Fatalf("capabilities %+v", c)
	}
	if got := c.RoundTTL(3500 * time.Millisecond); got != 4*time.Second {
		t.Fatalf("RoundTTL = %v", got)
	}
}

func TestNewAdoptsClient(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.Client(t)
	l, err := New(context.Background(), cli, &Options{Prefix: "/adopted"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	tok, err := l.Acquire(ctx, "job", "me", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "/adopted/l/job")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "me" || uint64(r.Kvs[0].CreateRevision) != tok {
		t.Fatalf("lock key: %v %v (token %d)", r, err, tok)
	}
	if err := l.Release(ctx, "job", "me"); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// The user's client is still usable.
	if _, err := cli.Get(ctx, "x"); err != nil {
		t.Fatalf("client closed by Locker.Close: %v", err)
	}
	if _, err := New(context.Background(), nil, &Options{}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New(nil): %v", err)
	}
	for _, o := range []Options{{Prefix: "/a//b"}, {MinTTL: 1500 * time.Millisecond}, {MinTTL: -time.Second}, {RequestTimeout: -1}} {
		if _, err := New(context.Background(), cli, &o); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("New(%+v): %v", o, err)
		}
	}
}

// Open(ctx, dsn) returns a *Locker on a client of its own; New with nil
// options uses every default; a ctx done before Open returns its error.
func TestOpenAndNewDefaults(t *testing.T) {
	ctx := testCtx(t)
	l, err := Open(ctx, testURL(t)+uniquePrefix(t)+"?min_ttl=3s")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Capabilities().MinTTL != 3*time.Second {
		t.Fatalf("Open: min_ttl not applied: %+v", l.Capabilities())
	}
	n, err := New(ctx, l.Client(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n.Prefix() != DefaultPrefix || n.Capabilities().MinTTL != DefaultMinTTL {
		t.Fatalf("New(nil options): prefix %q, min TTL %v", n.Prefix(), n.Capabilities().MinTTL)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatalf("the client of Open was closed by the Close of a New on it: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := Open(cctx, testURL(t)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled ctx: %v", err)
	}
}

func TestRegisteredAndOpenURL(t *testing.T) {
	found := false
	for _, n := range locker.Drivers() {
		found = found || n == Scheme
	}
	if !found {
		t.Fatalf("driver %q not registered: %v", Scheme, locker.Drivers())
	}
	l, err := locker.OpenURL(testURL(t) + uniquePrefix(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := testCtx(t)
	var ran bool
	if err := l.Do(ctx, "job", func(context.Context) error { ran = true; return nil }, locker.WithTTL(2*time.Second)); err != nil || !ran {
		t.Fatalf("Do: %v (ran %v)", err, ran)
	}
	if _, err := locker.OpenURL("etcd://127.0.0.1:1/p?bogus=1"); !errors.Is(err, locker.ErrInvalid) {
		t.Fatalf("OpenURL with an unknown parameter: %v", err)
	}
}
