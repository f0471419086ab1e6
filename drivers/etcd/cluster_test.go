package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/etcdtest"
)

// grant is the outcome of a waiter's Acquire, with what it saw of the
// previous holder at that moment.
type grant struct {
	lk         *locker.Lock
	err        error
	at         time.Time
	holderLost bool // the previous holder's Lost() was closed when the waiter got the lock
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func openLocker(t *testing.T, url string) (*locker.Locker, *Locker) {
	t.Helper()
	d, err := Driver{}.Open(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	l := locker.New(d)
	t.Cleanup(func() { _ = l.Close() })
	return l, d.(*Locker)
}

// waitFor starts w's Acquire of key in the background; the result records
// whether holder had already seen its loss when w was granted the key.
// Package locker returns transient backend errors from a wait (during an
// election etcd answers "request timed out"); the waiter, like an
// application would, tries again.
func waitFor(t *testing.T, ctx context.Context, w *locker.Locker, key string, ttl time.Duration, holder *locker.Lock) <-chan grant {
	got := make(chan grant, 1)
	go func() {
		for {
			lk, err := w.Acquire(ctx, key, locker.WithTTL(ttl))
			if err != nil && ctx.Err() == nil && !errors.Is(err, locker.ErrInvalid) && !errors.Is(err, locker.ErrClosed) {
				t.Logf("waiter: transient error, waiting again: %v", err)
				continue
			}
			got <- grant{lk: lk, err: err, at: time.Now(), holderLost: isClosed(holder.Lost())}
			return
		}
	}()
	return got
}

func followers(c *etcdtest.Cluster) []*etcdtest.Member {
	var fs []*etcdtest.Member
	for _, m := range c.Members {
		if m.Running() && !m.IsLeader() {
			fs = append(fs, m)
		}
	}
	return fs
}

// Kill the leader while a lock is held: no second holder appears, the
// holder keeps its lock (its renewals go to the new leader) or sees Lost(),
// and a waiter gets the lock once the holder's lease is gone.
func TestClusterLeaderStop(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	url := c.URL("/leader-stop")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ttl := 4 * time.Second

	h, hd := openLocker(t, url)
	w, _ := openLocker(t, url)
	lk, err := h.Acquire(ctx, "res", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, ctx, w, "res", ttl, lk)

	lead := c.Leader()
	if lead == nil {
		t.Fatal("no leader")
	}
	killed := time.Now()
	lead.Kill() // a crash: no leadership transfer
	if _, err := c.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("new leader %v after the leader was killed", time.Since(killed))
	// Watch the lock over several TTLs: the waiter may only get it if
	// the holder has seen its loss first.
	observe := time.NewTimer(3 * ttl)
	defer observe.Stop()
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("waiter: %v", g.err)
		}
		if !g.holderLost {
			t.Fatal("two holders: the waiter got the lock while the holder had not seen Lost()")
		}
		t.Logf("holder lost the lock during the election; waiter took over with token %d > %d", g.lk.Token(), lk.Token())
		if g.lk.Token() <= lk.Token() {
			t.Fatalf("token %d not above the previous holder's %d", g.lk.Token(), lk.Token())
		}
		return
	case <-observe.C:
	}
	if isClosed(lk.Lost()) {
		t.Log("holder saw Lost() during the election; no one else holds the lock yet")
	} else {
		// Still held: renewals reached the new leader.
		if err := lk.Refresh(ctx, ttl); err != nil {
			t.Fatalf("holder kept the lock but cannot refresh it: %v", err)
		}
		t.Logf("holder kept the lock across the leader change")
	}

	// The holder's process dies: its driver goes away without releasing.
	crashed := time.Now()
	_ = hd.Close()
	var g grant
	select {
	case g = <-got:
	case <-time.After(ttl + 30*time.Second):
		t.Fatal("waiter did not get the lock after the holder's lease ran out")
	}
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	defer g.lk.Release(ctx)
	if !g.holderLost {
		t.Fatal("two holders: the waiter got the lock before the holder saw Lost()")
	}
	if g.lk.Token() <= lk.Token() {
		t.Fatalf("token %d not above the previous holder's %d", g.lk.Token(), lk.Token())
	}
	t.Logf("waiter took over %v after the holder crashed (TTL %v)", g.at.Sub(crashed), ttl)
	if err := lead.Restart(); err != nil {
		t.Fatal(err)
	}
}

// Restart a member, then cut the holder's client off by stopping the only
// member it talks to: the holder's Lost() fires before the lease expires
// and the waiter (talking to the other members) gets the lock.
func TestClusterHolderCutOff(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	ttl := 6 * time.Second

	// A follower restarts and serves locks again, with their history.
	f := followers(c)[0]
	before, _ := openLocker(t, c.URL("/cut"))
	lk0, err := before.Acquire(ctx, "res", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	f.Stop()
	if err := lk0.Release(ctx); err != nil {
		t.Fatalf("release with a member down: %v", err)
	}
	if err := f.Restart(); err != nil {
		t.Fatal(err)
	}
	viaF, _ := openLocker(t, "etcd://"+f.Endpoint()+"/cut")
	lk1, err := viaF.Acquire(ctx, "res", locker.WithTTL(ttl))
	if err != nil {
		t.Fatalf("acquire through the restarted member: %v", err)
	}
	if lk1.Token() <= lk0.Token() {
		t.Fatalf("token %d after the restart is not above %d", lk1.Token(), lk0.Token())
	}
	if err := lk1.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// The holder talks to one follower only; the waiter to the others.
	if _, err := c.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	x := followers(c)[0]
	h, _ := openLocker(t, "etcd://"+x.Endpoint()+"/cut?request_timeout=1s")
	var rest []string
	for _, m := range c.Members {
		if m != x {
			rest = append(rest, m.Endpoint())
		}
	}
	w, _ := openLocker(t, "etcd://"+rest[0]+","+rest[1]+"/cut")
	lk, err := h.Acquire(ctx, "res", locker.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	got := waitFor(t, ctx, w, "res", ttl, lk)
	x.Stop()
	cut := time.Now()

	var g grant
	select {
	case g = <-got:
	case <-time.After(ttl + 30*time.Second):
		t.Fatal("waiter did not get the lock after the cut-off holder's lease ran out")
	}
	if g.err != nil {
		t.Fatalf("waiter: %v", g.err)
	}
	defer g.lk.Release(ctx)
	if !g.holderLost {
		t.Fatal("the waiter got the lock before the cut-off holder saw Lost()")
	}
	if g.lk.Token() <= lk.Token() {
		t.Fatalf("token %d not above the previous holder's %d", g.lk.Token(), lk.Token())
	}
	t.Logf("waiter took over %v after the cut (TTL %v)", g.at.Sub(cut), ttl)
	if err := x.Restart(); err != nil {
		t.Fatal(err)
	}
}

// A server restart (a crash, then a start from its data directory) keeps
// the revision, and so the fencing token, increasing: the token of the first
// grant after the restart is above every token before it. A lock held
// across the crash is seen as lost by its holder.
func TestTokensSurviveServerRestart(t *testing.T) {
	c := etcdtest.Start(t)
	m := c.Members[0]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, _ := openLocker(t, c.URL("/restart"))
	var last uint64
	for range 3 {
		lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		last = lk.Token()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held, err := l.TryAcquire(ctx, "held", locker.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	last = max(last, held.Token())
	m.Kill()
	select {
	case <-held.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not see Lost() while the server was down")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	l2, _ := openLocker(t, c.URL("/restart"))
	deadline := time.Now().Add(60 * time.Second)
	for {
		lk, err := l2.TryAcquire(ctx, "k", locker.WithTTL(2*time.Second))
		if err == nil {
			if lk.Token() <= last {
				t.Fatalf("token %d after a server restart is not above %d from before it", lk.Token(), last)
			}
			_ = lk.Release(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no grant within 60s of the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // the restarted server is electing itself
	}
}

// The leader of a 3-member cluster crashes and comes back while a lock is
// held: the election cancels the hold watch (its member has no leader for
// a while), which re-reads the key and re-arms instead of reporting a loss;
// renewals carry on, so Lost() stays open through it all. A delete after
// the restart is still reported, within the re-read's backoff.
func TestHoldSurvivesLeaderRestart(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	url := c.URL("/hold-restart")
	h, hd := openLocker(t, url)
	lk, err := h.TryAcquire(ctx, "res", locker.WithTTL(holdTTL))
	if err != nil {
		t.Fatal(err)
	}
	lead := c.Leader()
	if lead == nil {
		t.Fatal("no leader")
	}
	killed := time.Now()
	lead.Kill()
	if _, err := c.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := lead.Restart(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitLeader(60 * time.Second); err != nil {
		t.Fatal(err)
	}
	// Renewals through the new leader: one full renewal cycle after the
	// cluster is whole again.
	if err := lk.Refresh(ctx, holdTTL); err != nil {
		t.Fatalf("refresh after the restart: %v", err)
	}
	if isClosed(lk.Lost()) {
		t.Fatalf("Lost() closed across the leader restart: %v", lk.Err())
	}
	t.Logf("leader killed and restarted; cluster whole after %v, lock still held", time.Since(killed))
	other := c.Client(t)
	lostCh := lostAt(ctx, lk)
	faultAt := time.Now()
	if _, err := other.Delete(ctx, hd.LockKey("res")); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-lostCh:
		t.Logf("delete after the restart: Lost() %v later", at.Sub(faultAt))
		if !errors.Is(lk.Err(), locker.CauseServer) {
			t.Fatalf("Err() = %v, want cause server", lk.Err())
		}
	case <-time.After(holdRecheckMax + 2*time.Second):
		t.Fatal("the hold watch missed a delete after the leader restart")
	}
}
