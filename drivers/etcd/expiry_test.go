package etcd

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// expiryBound is how late after its TTL etcd frees a lock nobody renews:
// the leader's lessor looks for expired leases every 500ms, then deletes
// their keys through raft. The package documentation and the README
// quote it.
const expiryBound = 600 * time.Millisecond

// Locks nobody renews are freed after their TTL, never before, and within
// expiryBound of it. Grants are staggered over the lessor's 500ms period
// so that the samples cover its phase.
func TestExpiryLatency(t *testing.T) {
	ctx := testCtx(t)
	l := openTest(t, "")
	ttl := 2 * time.Second
	const n = 8
	wch := l.Client().Watch(ctx, l.Prefix()+"/l/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if r := <-wch; !r.Created {
		t.Fatalf("watch: %v", r.Err())
	}
	sent := map[string]time.Time{}
	for i := range n {
		key := fmt.Sprintf("k%d", i)
		sent[l.LockKey(key)] = time.Now()
		if _, err := l.Acquire(ctx, key, "o", ttl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond / n) // spreads the grants over the lessor's period
	}
	var late []time.Duration
	timeout := time.After(ttl + 5*time.Second)
	for len(late) < n {
		select {
		case r := <-wch:
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			for _, ev := range r.Events {
				if ev.Type != mvccpb.DELETE {
					continue
				}
				d := now.Sub(sent[string(ev.Kv.Key)].Add(ttl))
				if d < 0 {
					t.Errorf("%s freed %v before its TTL", ev.Kv.Key, -d)
				}
				late = append(late, d)
			}
		case <-timeout:
			t.Fatalf("only %d of %d locks freed within the TTL + 5s", len(late), n)
		}
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	t.Logf("freed after the TTL by: min %v, median %v, max %v", late[0], late[n/2], late[n-1])
	if late[n-1] > expiryBound {
		t.Errorf("a lock was freed %v after its TTL, want within %v", late[n-1], expiryBound)
	}
}
