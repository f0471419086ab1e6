package etcd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/opaquetest"
	"github.com/go-locker/locker/internal/sharedtest"
)

// openShared opens n Lockers on the test server, all with one prefix of
// their own.
func openShared(t *testing.T, n int) []*Locker {
	t.Helper()
	pfx := uniquePrefix(t)
	ls := make([]*Locker, n)
	for i := range ls {
		ls[i] = openURL(t, testURL(t)+pfx)
	}
	return ls
}

func srq(mode driver.SharedMode, owner string, ttl time.Duration, n int, wait bool) driver.SharedRequest {
	return driver.SharedRequest{Mode: mode, Owner: owner, TTL: ttl, Limit: n, Wait: wait}
}

// queued counts the wait-queue entries of the shared lock mode names on key.
func queued(t *testing.T, l *Locker, key string, mode driver.SharedMode) int64 {
	t.Helper()
	r, err := l.Client().Get(testCtx(t), l.SharedPrefix(key, mode)+"q/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

func waitQueued(t *testing.T, l *Locker, key string, mode driver.SharedMode, n int64) {
	t.Helper()
	waitUntil(t, 10*time.Second, fmt.Sprintf("%d queued requests", n), func() bool { return queued(t, l, key, mode) == n })
}

// sharedChildEnv carries "url|key" to the child process of
// TestSharedCrashedHolder.
const sharedChildEnv = "LOCKER_ETCD_SHARED_CHILD"

// sharedChildTTL is the TTL of the child's permit.
const sharedChildTTL = 2 * time.Second

// sharedChild holds a permit through package locker, renewing it, until
// it is killed.
func sharedChild(spec string) {
	u, key, _ := strings.Cut(spec, "|")
	d, err := Open(context.Background(), u)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	l := locker.New(d)
	if _, err := l.Semaphore(key, 2).TryAcquire(context.Background(), locker.WithTTL(sharedChildTTL), locker.WithOwner("child")); err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("permit")
	select {}
}

// A permit holder in another process, renewing through package locker, is
// killed with SIGKILL: its holder key is deleted with its lease after its
// TTL (counted from its last renewal, at most TTL/3 before the kill) and
// within expiryBound of it, a waiter is granted the permit soon after that
// deletion (measured 5-70ms under -race on a loaded machine; asserted
// within 250ms), and the other holder keeps its permit.
func TestSharedCrashedHolder(t *testing.T) {
	if spec := os.Getenv(sharedChildEnv); spec != "" {
		sharedChild(spec)
		return
	}
	t.Parallel()
	ctx := testCtx(t)
	ls := openShared(t, 2)
	a, b := ls[0], ls[1]
	const key = "uploads"
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedPermit, "parent", time.Minute, 2, false)); err != nil {
		t.Fatal(err)
	}
	cmd, out := startChild(t, sharedChildEnv, testURL(t)+a.Prefix()+"|"+key)
	if line, _ := out.ReadString('\n'); line != "permit\n" {
		t.Fatalf("child: %q", line)
	}
	// Watch the child's holder key for its deletion.
	hk := a.SharedPrefix(key, driver.SharedPermit) + "h/p/child"
	wch := a.Client().Watch(ctx, hk, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	if r := <-wch; !r.Created {
		t.Fatalf("watch: %v", r.Err())
	}
	granted := make(chan time.Time, 1)
	go func() {
		if _, err := b.AcquireShared(ctx, key, srq(driver.SharedPermit, "next", time.Minute, 2, true)); err != nil {
			t.Error(err)
		}
		granted <- time.Now()
	}()
	waitQueued(t, a, key, driver.SharedPermit, 1)
	time.Sleep(2 * sharedChildTTL) // the child renews: its permit outlives its TTL
	select {
	case <-granted:
		t.Fatal("the waiter was granted while the child renews its permit")
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var deleted time.Time
	select {
	case r := <-wch:
		if len(r.Events) == 0 || r.Events[0].Type != mvccpb.DELETE {
			t.Fatalf("watch: %+v, %v", r, r.Err())
		}
		deleted = time.Now()
	case <-time.After(sharedChildTTL + 5*time.Second):
		t.Fatal("the dead child's holder key was not deleted")
	}
	after := deleted.Sub(killed)
	if after < sharedChildTTL*2/3-50*time.Millisecond || after > sharedChildTTL+expiryBound {
		t.Errorf("the dead child's permit ended %v after the kill, want after its TTL (%v, from its last renewal) and within %v of it", after, sharedChildTTL, expiryBound)
	}
	var at time.Time
	select {
	case at = <-granted:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter was not granted the dead child's permit")
	}
	t.Logf("the child's key was deleted %v after the kill (TTL %v); the waiter was granted %v after the deletion", after, sharedChildTTL, at.Sub(deleted))
	if d := at.Sub(deleted); d > 250*time.Millisecond {
		t.Errorf("the waiter was granted %v after the dead child's permit ended, want within 250ms", d)
	}
	if err := a.RefreshShared(ctx, key, driver.SharedPermit, "parent", time.Minute); err != nil {
		t.Fatalf("the parent lost its permit with the child's: %v", err)
	}
}

// Writer preference under load: 8 readers in their own Lockers take and
// release read holds in a loop (each held 2ms); a writer that starts
// waiting is granted once the reads in force at its arrival end, within
// 3s, far below the readers' 10s TTL (measured 30-50ms; 0.3-1s under
// -race on a loaded machine), and holds alone.
func TestSharedWriterStarvation(t *testing.T) {
	ls := openShared(t, 9)
	sharedtest.WriterStarvation(t, func() driver.SharedLocker { l := ls[0]; ls = ls[1:]; return l }, 3*time.Second)
}

// Keys and owners are opaque: with separators, colons, newlines, NUL and
// non-UTF-8 bytes, and keys that look like the driver's own layout, each
// key's semaphore and read-write lock are its own (beside a mutex on the
// same key), a waiter in another Locker is woken and granted within
// opaquetest.HandoffMax, the holder key is SharedPrefix+"h/"+mode+"/"+owner
// byte for byte, and InspectShared reports the exact owner.
func TestSharedOpaqueKeys(t *testing.T) {
	var ho opaquetest.Handoffs
	defer func() { ho.Check(t) }()
	ctx := testCtx(t)
	ls := openShared(t, 2)
	a, b := ls[0], ls[1]
	names := append([]string{"a", "a/", "1:a/", "a/h/p/x", "h/", "q/w/"}, opaquetest.Names...)
	for i, key := range names {
		if _, err := a.Acquire(ctx, key, names[(i+1)%len(names)], time.Minute); err != nil {
			t.Fatalf("the mutex of %q: %v", key, err)
		}
	}
	opaquetest.SharedRun(t, ctx, &ho, a, b, names, func(key string, mode driver.SharedMode) {
		waitQueued(t, a, key, mode, 1)
	}, func(key string, mode driver.SharedMode, hold driver.SharedInfo) {
		r, err := a.Client().Get(ctx, a.SharedPrefix(key, mode)+"h/"+modeLetter(mode)+"/"+hold.Owner)
		if err != nil || len(r.Kvs) != 1 || uint64(r.Kvs[0].CreateRevision) != hold.Token {
			t.Fatalf("holder key of %q, %v: %v, %v", key, mode, r, err)
		}
	})
}

// The regression of a wait cancelled while the server restarts: in a
// 3-member cluster, the leader crashes while a writer waits, and the wait
// is cancelled before the others have elected a new leader, so its queue
// entry cannot be deleted then. The entry must not outlive the wait: a
// read is granted, and the queue is empty, within 3s of the new leader's
// election (a wait lease that lived on, renewed through the new leader,
// would block the lock for good; one merely left to expire, over 5s).
// Then the crashed member restarts, and the lock works on.
func TestSharedWaitCancelledDuringRestart(t *testing.T) {
	t.Parallel()
	c := etcdtest.StartCluster(t, 3)
	ctx := testCtx(t)
	url := c.URL(uniquePrefix(t))
	a, b := openURL(t, url), openURL(t, url)
	const key = "catalog"
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r0", time.Minute, 0, false)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.AcquireShared(wctx, key, srq(driver.SharedWrite, "w", time.Minute, 0, true))
		done <- err
	}()
	waitQueued(t, a, key, driver.SharedRead, 1)
	if _, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r1", time.Minute, 0, false)); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("a read behind the waiting writer: %v, want ErrNotAcquired", err)
	}
	lead, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	killed := make(chan struct{})
	go func() { defer close(killed); lead.Kill() }()
	waitUntil(t, 10*time.Second, "the leader to stop", func() bool { return !lead.Running() })
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the cancelled wait: %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the wait did not end within 2s of its ctx")
	}
	if _, err := c.WaitLeader(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	elected := time.Now()
	const bound = 3 * time.Second
	for {
		_, err := a.AcquireShared(ctx, key, srq(driver.SharedRead, "r1", time.Minute, 0, false))
		if err == nil {
			break
		}
		if time.Since(elected) > bound {
			t.Fatalf("no read granted within %v of the new leader's election: %v (%d queued)", bound, err, queued(t, a, key, driver.SharedRead))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a read was granted %v after the new leader's election", time.Since(elected))
	if n := queued(t, a, key, driver.SharedRead); n != 0 {
		t.Fatalf("%d queue entries left after the cancelled wait", n)
	}
	<-killed
	if err := lead.Restart(); err != nil {
		t.Fatal(err)
	}
	// The lock works on: a waiting writer is granted once the reads end.
	got := make(chan error, 1)
	go func() {
		_, err := b.AcquireShared(ctx, key, srq(driver.SharedWrite, "w2", time.Minute, 0, true))
		got <- err
	}()
	waitQueued(t, a, key, driver.SharedRead, 1)
	for _, o := range []string{"r0", "r1"} {
		if err := a.ReleaseShared(ctx, key, driver.SharedRead, o); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the writer was not granted after the reads ended")
	}
}

// startChild runs the current test again in a child process, with env set
// to spec (the test then plays the child's part), and returns it with its
// standard output. The child is killed when the test ends.
func startChild(t *testing.T, env, spec string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$")
	cmd.Env = append(os.Environ(), env+"="+spec, "LOCKER_TEST_ETCD_URL="+testURL(t))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewReader(out)
}
