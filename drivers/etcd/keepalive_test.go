package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance/faultproxy"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestRenewOnSharedStream(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	g, err := l.Client().Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent renewals of one lease each get an answer.
	errs := make(chan error, 10)
	for range 10 {
		go func() {
			ttl, err := l.renew(ctx, g.ID)
			if err == nil && ttl != 5 {
				t.Errorf("renew TTL %d, want 5", ttl)
			}
			errs <- err
		}()
	}
	for range 10 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The stream breaks: pending and later renewals still work (one
	// retry on a new stream).
	ka := l.kaFor(g.ID)
	ka.mu.Lock()
	ka.endStream(ka.stream, context.Canceled)
	ka.mu.Unlock()
	le := lease{id: g.ID, secs: 5}
	if ttl, err := l.keepAlive(ctx, &le); err != nil || ttl != 5 || time.Until(le.expires) < 4*time.Second {
		t.Fatalf("renew after the stream broke: %d %v (expires in %v)", ttl, err, time.Until(le.expires))
	}
	// A revoked lease cannot be renewed.
	if _, err := l.Client().Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := l.renew(ctx, g.ID); !isLeaseNotFound(err) {
		t.Fatalf("renew of a revoked lease: %v", err)
	}
	if _, err := l.renew(ctx, clientv3.LeaseID(12345)); !isLeaseNotFound(err) {
		t.Fatalf("renew of an unknown lease: %v", err)
	}
	// A done context returns at once.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.renew(cctx, g.ID); err != context.Canceled {
		t.Fatalf("renew with a cancelled context: %v", err)
	}
}

// A keepalive stream whose oldest request waits kaStall is abandoned by the
// renewal that gives up on it, so the next renewal opens a new stream
// instead of queueing behind the stalled request. The server answers a
// stream's requests one at a time; here the stream's connection is
// blackholed, and a new stream reaches the server through the other one.
func TestStalledStreamAbandoned(t *testing.T) {
	srv := strings.TrimPrefix(testURL(t), "etcd://")
	var addrs []string
	var cut *faultproxy.Proxy
	for i := range 2 {
		p, err := faultproxy.New(srv)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		if i == 0 {
			cut = p
		}
		addrs = append(addrs, p.Addr())
	}
	d, err := Driver{}.Open("etcd://" + strings.Join(addrs, ",") + uniquePrefix(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	l := d.(*Locker)
	ctx := testCtx(t)
	g, err := l.Client().Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	renew := func() (int64, error) {
		rctx, cancel := context.WithTimeout(ctx, 2*kaStall)
		defer cancel()
		return l.renew(rctx, g.ID)
	}
	// The client balances over the connections that are ready: wait until
	// the server has answered through the proxy to be cut, so that its
	// connection is one of them.
	deadline := time.Now().Add(10 * time.Second)
	for cut.Delivered() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server never answered through the proxy to be cut")
		}
		if _, err := l.Client().Get(ctx, "probe"); err != nil {
			t.Fatal(err)
		}
	}
	cut.Blackhole()
	defer cut.Heal()
	// Open new streams until one is on the blackholed connection.
	ka := l.kaFor(g.ID)
	stalled := false
	for range 20 {
		ka.mu.Lock()
		if ka.stream != nil {
			ka.endStream(ka.stream, context.Canceled)
		}
		ka.mu.Unlock()
		if _, err := renew(); errors.Is(err, context.DeadlineExceeded) {
			stalled = true
			break
		}
	}
	if !stalled {
		t.Fatal("no keepalive stream landed on the blackholed connection in 20 tries")
	}
	for i := range 6 {
		ttl, err := renew()
		if err == nil {
			if ttl != 30 {
				t.Fatalf("renewal after the stall: TTL %d, want 30", ttl)
			}
			t.Logf("renewal %d after the stall got an answer", i+1)
			return
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("renewal after the stall: %v", err)
		}
	}
	t.Fatal("6 renewals after the stall got no answer: the stalled stream was kept")
}
