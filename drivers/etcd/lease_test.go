package etcd

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/etcdtest"
)

// A cancelled acquire leaves no lock and no lease behind.
func TestCancelledAcquireRevokesLease(t *testing.T) {
	c := etcdtest.Start(t)
	cli := c.Client(t)
	d, err := Driver{}.Open(c.URL("/cancel"))
	if err != nil {
		t.Fatal(err)
	}
	l := d.(*Locker)
	defer l.Close()
	held := 0
	for i := range 40 {
		// Deadlines from 0 to ~4ms cut the grant or the transaction
		// short at various points.
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i)*100*time.Microsecond)
		key := "k" + randHex(4)
		_, err := l.Acquire(ctx, key, "o", time.Minute) // completed ones stay held
		cancel()
		if err == nil {
			held++
			continue
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire with an expiring context: %v", err)
		}
		if r := keyOf(t, cli, l.LockKey(key)); len(r.Kvs) != 0 {
			t.Fatalf("cancelled Acquire left the lock %v", r.Kvs)
		}
	}
	t.Logf("%d of 40 acquires completed before their deadline", held)
	// Every lease still on the server belongs to a completed acquire.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, err := cli.Leases(testCtx(t))
		if err == nil && len(r.Leases) == held {
			break
		}
		if time.Now().After(deadline) {
			for _, le := range r.Leases {
				ttl, err := cli.TimeToLive(testCtx(t), le.ID, clientv3.WithAttachedKeys())
				t.Logf("lease %x: %+v %v", le.ID, ttl, err)
			}
			t.Fatalf("%d leases left, want %d (%v)", len(r.Leases), held, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A spare lease is reused by the next Acquire and renewed to a full TTL.
func TestSpareLeaseReuse(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	if _, err := l.Acquire(ctx, "a", "o", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	first := keyOf(t, l.Client(), l.LockKey("a")).Kvs[0].Lease
	if err := l.Release(ctx, "a", "o"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "b", "o", 3*time.Second); err != nil {
		t.Fatal(err)
	}
	kv := keyOf(t, l.Client(), l.LockKey("b")).Kvs[0]
	if kv.Lease != first {
		t.Fatalf("lease %x not reused (got %x)", first, kv.Lease)
	}
	ttl, err := l.Client().TimeToLive(ctx, clientv3.LeaseID(kv.Lease), clientv3.WithAttachedKeys())
	if err != nil || ttl.TTL < 2 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != l.LockKey("b") {
		t.Fatalf("reused lease: %+v %v", ttl, err)
	}
	// Another TTL does not reuse it.
	if _, err := l.Acquire(ctx, "c", "o", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if kv := keyOf(t, l.Client(), l.LockKey("c")).Kvs[0]; kv.Lease == first {
		t.Fatal("a 3s lease was reused for a 2s lock")
	}
}

// A waiter whose lease expired while it waited is not told it holds the
// lock (the etcd 3.4.3 bug Jepsen found): here the spare lease an Acquire
// would reuse is revoked behind the driver's back.
func TestExpiredLeaseNeverGrants(t *testing.T) {
	l := openTest(t, "")
	ctx := testCtx(t)
	if _, err := l.Acquire(ctx, "a", "o", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	lease := clientv3.LeaseID(keyOf(t, l.Client(), l.LockKey("a")).Kvs[0].Lease)
	if err := l.Release(ctx, "a", "o"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	tok, err := l.Acquire(ctx, "a", "o2", 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	kv := keyOf(t, l.Client(), l.LockKey("a")).Kvs
	if len(kv) != 1 || uint64(kv[0].CreateRevision) != tok || clientv3.LeaseID(kv[0].Lease) == lease {
		t.Fatalf("granted on a dead lease: %v (token %d)", kv, tok)
	}
	ttl, err := l.Client().TimeToLive(ctx, clientv3.LeaseID(kv[0].Lease))
	if err != nil || ttl.TTL <= 0 {
		t.Fatalf("lock lease not alive: %+v %v", ttl, err)
	}
}

// A server whose minimum lease TTL (1.5 election timeouts: 1.5s here) is
// above the TTL asked for would silently grant a longer lease; the driver
// refuses instead of holding a lock past its TTL.
func TestServerMinimumAboveMinTTL(t *testing.T) {
	l := openTest(t, "?min_ttl=1s")
	ctx := testCtx(t)
	_, err := l.Acquire(ctx, "k", "o", time.Second)
	if !errors.Is(err, driver.ErrInvalid) || !strings.Contains(err.Error(), "min_ttl") {
		t.Fatalf("Acquire of 1s on a server with a 1.5s minimum: %v", err)
	}
	if r := keyOf(t, l.Client(), l.LockKey("k")); len(r.Kvs) != 0 {
		t.Fatalf("lock left behind: %v", r.Kvs)
	}
	// 2s is fine.
	if _, err := l.Acquire(ctx, "k", "o", 2*time.Second); err != nil {
		t.Fatal(err)
	}
}
