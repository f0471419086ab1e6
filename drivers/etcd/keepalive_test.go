package etcd

import (
	"context"
	"testing"
	"time"

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
	l.ka.mu.Lock()
	l.endStream(l.ka.stream, context.Canceled)
	l.ka.mu.Unlock()
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
