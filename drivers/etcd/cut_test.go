package etcd

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/go-locker/locker"
)

// replyCutter is a client whose next transaction matching a predicate
// reaches the server and is applied, and whose reply is then dropped as
// the caller's context ends: an Acquire or Refresh cut short at the most
// ambiguous point.
type replyCutter struct {
	mu     sync.Mutex
	match  func(*pb.TxnRequest) bool
	cancel context.CancelFunc
	cut    int
}

// arm makes the next matching transaction's reply be lost as cancel ends
// the caller's context.
func (c *replyCutter) arm(match func(*pb.TxnRequest) bool, cancel context.CancelFunc) {
	c.mu.Lock()
	c.match, c.cancel = match, cancel
	c.mu.Unlock()
}

func (c *replyCutter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	txn, ok := req.(*pb.TxnRequest)
	if !ok || err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.match == nil || !c.match(txn) {
		return err
	}
	c.match = nil
	c.cut++
	c.cancel()
	return ctx.Err()
}

func (c *replyCutter) client(t *testing.T) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(strings.TrimPrefix(testURL(t), "etcd://"), ","),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// isMove matches the transaction that moves a held key to a new lease
// (create revision and value compared, a put).
func isMove(r *pb.TxnRequest) bool {
	return len(r.Compare) == 2 && len(r.Success) == 1 && r.Success[0].GetRequestPut() != nil
}

// isCreate matches Acquire's transaction (create revision 0, a put).
func isCreate(r *pb.TxnRequest) bool {
	return len(r.Compare) == 1 && len(r.Success) == 1 && r.Success[0].GetRequestPut() != nil
}

// An Acquire or Refresh by the owner of a lock held through another Locker
// (a WithOwner handover), cut short after the server moved the key to a
// lease of the new TTL, leaves that lock held: the first Locker's Lost()
// stays open and it keeps renewing. An Acquire cut short after it created
// a new lock leaves nothing behind.
func TestCutAcquireKeepsPriorHold(t *testing.T) {
	ctx := testCtx(t)
	pfx := uniquePrefix(t)
	a, ad := openLocker(t, testURL(t)+pfx)
	var cut replyCutter
	b, err := New(context.Background(), cut.client(t), &Options{Prefix: pfx})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })

	lk, err := a.TryAcquire(ctx, "k", locker.WithTTL(2*time.Second), locker.WithOwner("me"))
	if err != nil {
		t.Fatal(err)
	}
	k := ad.LockKey("k")
	held := func(what string) {
		t.Helper()
		r := keyOf(t, ad.Client(), k)
		if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "me" || uint64(r.Kvs[0].CreateRevision) != lk.Token() {
			t.Fatalf("%s: the lock held before it is gone: %v", what, r.Kvs)
		}
		if isClosed(lk.Lost()) {
			t.Fatalf("%s: the first Locker's Lost() closed: %v", what, lk.Err())
		}
		ttl, err := ad.Client().TimeToLive(ctx, clientv3.LeaseID(r.Kvs[0].Lease))
		if err != nil || ttl.TTL <= 0 {
			t.Fatalf("%s: the lock's lease: %+v %v", what, ttl, err)
		}
	}
	for _, c := range []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error {
			_, err := b.Acquire(ctx, "k", "me", 3*time.Second)
			return err
		}},
		{"Refresh", func(ctx context.Context) error { return b.Refresh(ctx, "k", "me", 4*time.Second) }},
	} {
		cctx, cancel := context.WithCancel(ctx)
		cut.arm(isMove, cancel)
		err := c.call(cctx)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s cut short: %v, want context.Canceled", c.name, err)
		}
		held(c.name + " cut short")
	}
	if cut.cut != 2 {
		t.Fatalf("%d replies cut, want 2", cut.cut)
	}
	// The first Locker still holds it: it renews past the TTL it had.
	if err := lk.Refresh(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
		t.Fatalf("lost after the cut attempts: %v", lk.Err())
	case <-time.After(3 * time.Second):
	}
	held("three seconds later")
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// A new grant cut short is revoked before Acquire returns.
	cctx, cancel := context.WithCancel(ctx)
	cut.arm(isCreate, cancel)
	_, err = b.Acquire(cctx, "fresh", "x", 10*time.Second)
	cancel()
	if !errors.Is(err, context.Canceled) || cut.cut != 3 {
		t.Fatalf("Acquire cut short: %v (%d cuts)", err, cut.cut)
	}
	if r := keyOf(t, ad.Client(), ad.LockKey("fresh")); len(r.Kvs) != 0 {
		t.Fatalf("a cut Acquire left its new lock behind: %v", r.Kvs)
	}
}
