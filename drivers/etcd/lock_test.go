package etcd

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
)

// waitUntil polls cond every few milliseconds until it holds or timeout
// passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func keyOf(t *testing.T, cli *clientv3.Client, k string) *clientv3.GetResponse {
	t.Helper()
	r, err := cli.Get(testCtx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTokenIsCreateRevision(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	tok, err := l.Acquire(ctx, "job", "o1", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	r := keyOf(t, l.Client(), l.LockKey("job"))
	if len(r.Kvs) != 1 || uint64(r.Kvs[0].CreateRevision) != tok || string(r.Kvs[0].Value) != "o1" || r.Kvs[0].Lease == 0 {
		t.Fatalf("lock key %v, token %d", r.Kvs, tok)
	}
	if !strings.HasPrefix(l.LockKey("job"), l.Prefix()+"/l/") {
		t.Fatalf("lock key %q outside prefix %q", l.LockKey("job"), l.Prefix())
	}
	ttl, err := l.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 2 {
		t.Fatalf("lease: %+v %v", ttl, err)
	}
	// A 2.1s TTL is a 3s lease.
	if err := l.Refresh(ctx, "job", "o1", 2100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	r = keyOf(t, l.Client(), l.LockKey("job"))
	ttl, err = l.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 3 || uint64(r.Kvs[0].CreateRevision) != tok {
		t.Fatalf("after Refresh with a new TTL: %+v %v %v", ttl, r.Kvs, err)
	}
	// Idempotent acquire with yet another TTL keeps the token.
	tok2, err := l.Acquire(ctx, "job", "o1", 4*time.Second)
	if err != nil || tok2 != tok {
		t.Fatalf("idempotent acquire: %d %v, want %d", tok2, err, tok)
	}
	r = keyOf(t, l.Client(), l.LockKey("job"))
	ttl, err = l.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
	if err != nil || ttl.GrantedTTL != 4 {
		t.Fatalf("after idempotent acquire with a new TTL: %+v %v", ttl, err)
	}
}

func TestPrefixIsolation(t *testing.T) {
	base := testURL(t)
	a, err := Driver{}.Open(base + "/app-a-" + randHex(4))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Driver{}.Open(base + "/app-b-" + randHex(4))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := testCtx(t)
	if _, err := a.Acquire(ctx, "same", "x", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "same", "y", 2*time.Second); err != nil {
		t.Fatalf("a lock under another prefix interfered: %v", err)
	}
	// Keys that are prefixes of each other do not interfere either, nor
	// do their wait queues.
	la := a.(*Locker)
	for _, k := range []string{"a", "a/b", "a/", "l/a", "w/1:a/x"} {
		if _, err := la.Acquire(ctx, k, "o", 2*time.Second); err != nil {
			t.Fatalf("Acquire(%q): %v", k, err)
		}
	}
	// No queue's prefix is a prefix of another's: subscribers' or waiting
	// Acquires', for keys that are prefixes of each other or look like
	// the queues' own names.
	var qs []string
	for _, k := range []string{"a", "a/", "q", "q/1:a", "1:a/"} {
		qs = append(qs, la.WaitPrefix(k), la.MutexQueuePrefix(k))
	}
	for i, p := range qs {
		for j, q := range qs {
			if i != j && strings.HasPrefix(q, p) {
				t.Fatalf("queue prefixes overlap: %q is under %q", q, p)
			}
		}
	}
}

func TestBadInputLeavesNothing(t *testing.T) {
	l := openTest(t, "?min_ttl=2s")
	ctx := testCtx(t)
	check := func(name string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		} else if !strings.HasPrefix(err.Error(), "etcd: ") {
			t.Errorf("%s: error %q does not name the backend", name, err)
		}
	}
	_, err := l.Acquire(ctx, "k", "o", 1500*time.Millisecond)
	check("ttl under the minimum", err)
	_, err = l.Acquire(ctx, "k", "o", 0)
	check("zero ttl", err)
	_, err = l.Acquire(ctx, "", "o", 2*time.Second)
	check("empty key", err)
	_, err = l.Acquire(ctx, strings.Repeat("k", MaxKeyLen+1), "o", 2*time.Second)
	check("long key", err)
	_, err = l.Acquire(ctx, "k", "", 2*time.Second)
	check("empty owner", err)
	check("refresh ttl under the minimum", l.Refresh(ctx, "k", "o", time.Second))
	check("release empty owner", l.Release(ctx, "k", ""))
	_, _, err = l.Subscribe(ctx, "")
	check("subscribe empty key", err)
	r, err := l.Client().Get(ctx, l.Prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 0 {
		t.Fatalf("bad input left %d keys (%v)", r.Count, err)
	}
}

func TestUnreachableEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	d, err := Driver{}.Open("etcd://" + addr + "/p?request_timeout=500ms&dial_timeout=500ms")
	if err != nil {
		t.Fatalf("Open does no I/O, yet: %v", err)
	}
	defer d.Close()
	start := time.Now()
	_, err = d.Acquire(context.Background(), "k", "o", 2*time.Second)
	if err == nil || errors.Is(err, driver.ErrNotAcquired) || !strings.HasPrefix(err.Error(), "etcd: acquire") {
		t.Fatalf("Acquire on an unreachable endpoint: %v", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Acquire took %v despite request_timeout=500ms", el)
	}
	// The caller's deadline wins, and is reported as such.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := d.(*Locker).Ping(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping with an expiring context: %v", err)
	}
	t.Logf("unreachable: %v", err)
}

// Release compares the revision this Locker granted, so a stale Release
// does not delete a newer incarnation granted elsewhere to the same owner
// (etcd #22082).
func TestReleaseComparesRevision(t *testing.T) {
	a := openTest(t, "")
	b, err := New(context.Background(), a.Client(), &Options{Prefix: a.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t)
	t1, err := a.Acquire(ctx, "k", "same-owner", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The first incarnation disappears (as if it expired)…
	if _, err := a.Client().Delete(ctx, a.LockKey("k")); err != nil {
		t.Fatal(err)
	}
	// …and another Locker grants the key to the same owner.
	t2, err := b.Acquire(ctx, "k", "same-owner", 2*time.Second)
	if err != nil || t2 <= t1 {
		t.Fatalf("second grant: %d %v (first %d)", t2, err, t1)
	}
	if err := a.Release(ctx, "k", "same-owner"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("stale Release: %v, want ErrNotHeld", err)
	}
	if kv := keyOf(t, a.Client(), a.LockKey("k")).Kvs; len(kv) != 1 || uint64(kv[0].CreateRevision) != t2 {
		t.Fatalf("stale Release deleted the newer incarnation: %v", kv)
	}
	if err := b.Release(ctx, "k", "same-owner"); err != nil {
		t.Fatal(err)
	}
}

func TestInspect(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	if _, err := l.Inspect(ctx, "k"); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect of a free key: %v", err)
	}
	tok, err := l.Acquire(ctx, "k", "me", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	in, err := l.Inspect(ctx, "k")
	if err != nil || in.Owner != "me" || in.Token != tok || in.Remaining < 3*time.Second || in.Remaining > 5*time.Second {
		t.Fatalf("Inspect: %+v %v", in, err)
	}
}
