package etcd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/faultproxy"
)

// mutexQueued counts the entries of key's mutex queue.
func mutexQueued(t *testing.T, l *Locker, key string) int64 {
	t.Helper()
	r, err := l.Client().Get(testCtx(t), l.MutexQueuePrefix(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

func waitMutexQueued(t *testing.T, l *Locker, key string, n int64) {
	t.Helper()
	waitUntil(t, 10*time.Second, fmt.Sprintf("%d queued Acquires", n), func() bool { return mutexQueued(t, l, key) == n })
}

// Waiting Acquires, each in a Locker of its own as separate processes
// would be, are granted in the order they queued, and the holder that
// releases and asks again at once is served after them: it does not barge
// in. A second caller of a Locker already queued does not take that
// Locker's place: it queues in the server once the first is granted,
// behind the others. Nobody holds the key beside another, and the queue
// is empty at the end.
func TestMutexWaitFIFO(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	const key = "fifo"
	const n = 4
	ds := openShared(t, n+1)
	ls := make([]*locker.Locker, n+1)
	for i, d := range ds {
		ls[i] = locker.New(d)
	}
	first, err := ls[0].Acquire(ctx, key, locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// Each grant is held until the test releases it, so grants arrive on
	// the channel in the order they were made.
	type grant struct {
		i   int
		lk  *locker.Lock
		err error
	}
	grants := make(chan grant, n+2)
	acquire := func(i int) {
		lk, err := ls[i].Acquire(ctx, key, locker.WithTTL(time.Minute))
		grants <- grant{i, lk, err}
	}
	for i := 1; i <= n; i++ {
		go acquire(i)
		waitMutexQueued(t, ds[0], key, int64(i))
		if i == 1 {
			// A second caller of Locker 1: it waits in the process
			// until the first is granted, then queues in the server.
			go acquire(1)
		}
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	go acquire(0)
	var got []int
	for range n + 2 {
		select {
		case g := <-grants:
			if g.err != nil {
				t.Fatalf("Locker %d: %v", g.i, g.err)
			}
			got = append(got, g.i)
			if err := g.lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("granted so far: %v; the next waiter was not granted", got)
		}
	}
	// The releasing Locker 0 and Locker 1's second caller both queue after
	// 2, 3 and 4, in either order.
	if fmt.Sprint(got[:n]) != "[1 2 3 4]" || got[n]+got[n+1] != 1 {
		t.Errorf("granted in the order %v, want 1, 2, 3, 4, then 0 and 1 in either order", got)
	}
	if q := mutexQueued(t, ds[0], key); q != 0 {
		t.Errorf("%d entries left in the queue", q)
	}
}

// mutexChildEnv carries "url|key" to the child process of
// TestMutexWaitKilledWaiter.
const mutexChildEnv = "LOCKER_ETCD_MUTEX_CHILD"

// mutexChild waits for key through package locker until it is killed.
func mutexChild(spec string) {
	u, key, _ := strings.Cut(spec, "|")
	d, err := Open(context.Background(), u)
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	_, err = locker.New(d).Acquire(context.Background(), key, locker.WithTTL(time.Minute))
	fmt.Println("returned:", err)
}

// childFirstInQueue opens n Lockers on one prefix, takes key with the
// first, and starts a child process (mutexChild), connected to childURL
// (the test server, or a proxy in front of it), whose Acquire of key waits,
// first in the queue. It returns once the child's entry is queued.
func childFirstInQueue(t *testing.T, key string, n int, childURL string) ([]*Locker, []*locker.Locker, *locker.Lock, *exec.Cmd, *bufio.Reader) {
	t.Helper()
	ds := openShared(t, n)
	ls := make([]*locker.Locker, n)
	for i, d := range ds {
		ls[i] = locker.New(d)
	}
	lk, err := ls[0].Acquire(testCtx(t), key, locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	cmd, out := startChild(t, mutexChildEnv, childURL+ds[0].Prefix()+"|"+key)
	waitMutexQueued(t, ds[0], key, 1)
	return ds, ls, lk, cmd, out
}

// A waiter first in the queue is killed with SIGKILL. Its entry holds the
// queue up until its wait lease lapses (5s after its last renewal, at most
// a third of that before the kill): the waiter behind it is granted after
// that, within the lease checker's bound, and not before. Meanwhile a
// one-shot TryAcquire of the free key succeeds: it does not queue.
func TestMutexWaitKilledWaiter(t *testing.T) {
	if spec := os.Getenv(mutexChildEnv); spec != "" {
		mutexChild(spec)
		return
	}
	t.Parallel()
	ctx := testCtx(t)
	const key = "killed-waiter"
	ds, ls, lk, cmd, _ := childFirstInQueue(t, key, 3, testURL(t))
	b, c := ls[1], ls[2]
	granted := make(chan time.Time, 1)
	failed := make(chan error, 1)
	go func() {
		lk, err := b.Acquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			failed <- err
			return
		}
		granted <- time.Now()
		_ = lk.Release(ctx)
	}()
	waitMutexQueued(t, ds[0], key, 2)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	one, err := c.TryAcquire(ctx, key, locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("TryAcquire of the free key while a dead waiter's entry queues: %v", err)
	}
	if err := one.Release(ctx); err != nil {
		t.Fatal(err)
	}
	secs := time.Duration(ds[0].waitSecs()) * time.Second
	select {
	case at := <-granted:
		after := at.Sub(killed)
		t.Logf("the waiter behind the killed one was granted %v after the kill (wait lease %v)", after, secs)
		if after < secs*2/3-100*time.Millisecond {
			t.Errorf("granted %v after the kill, before the dead waiter's entry can have lapsed (%v after its last renewal)", after, secs)
		}
	case err := <-failed:
		t.Fatalf("the waiter behind the killed one: %v", err)
	case <-time.After(secs + expiryBound + 2*time.Second):
		t.Fatal("the waiter behind the killed one was not granted")
	}
	waitMutexQueued(t, ds[0], key, 0)
}

// A Locker closed while its Acquire is queued leaves the queue before
// Close returns: its entry is gone at once (not when its wait lease
// lapses), the call returns ErrClosed, and the waiter behind it is granted
// at the release. Five rounds.
func TestMutexWaitClosedWaiter(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	const key = "closed-waiter"
	for round := range 5 {
		ds := openShared(t, 3)
		a, b, c := locker.New(ds[0]), locker.New(ds[1]), locker.New(ds[2])
		lk, err := a.Acquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		bErr := make(chan error, 1)
		go func() {
			_, err := b.Acquire(ctx, key, locker.WithTTL(time.Minute))
			bErr <- err
		}()
		waitMutexQueued(t, ds[0], key, 1)
		cGranted := make(chan *locker.Lock, 1)
		cErr := make(chan error, 1)
		go func() {
			lk, err := c.Acquire(ctx, key, locker.WithTTL(time.Minute))
			if err != nil {
				cErr <- err
				return
			}
			cGranted <- lk
		}()
		waitMutexQueued(t, ds[0], key, 2)
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if q := mutexQueued(t, ds[0], key); q != 1 {
			t.Fatalf("round %d: %d entries queued right after Close, want 1 (the closed Locker's entry left behind)", round, q)
		}
		if err := <-bErr; !errors.Is(err, locker.ErrClosed) {
			t.Fatalf("round %d: the closed Locker's Acquire returned %v, want ErrClosed", round, err)
		}
		released := time.Now()
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
		select {
		case lk := <-cGranted:
			if d := time.Since(released); d > time.Second {
				t.Errorf("round %d: the waiter behind the closed one was granted %v after the release, want within 1s", round, d)
			}
			_ = lk.Release(ctx)
		case err := <-cErr:
			t.Fatalf("round %d: the waiter behind the closed one: %v", round, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the waiter behind the closed one was not granted", round)
		}
		_ = a.Close()
		_ = c.Close()
	}
}

// A waiter first in the queue stops: paused (SIGSTOP), or cut off from
// the cluster (a fault proxy in front of it drops every byte). Its entry
// lapses with its wait lease and the waiter behind it is granted, as for a
// killed one. Resumed (SIGCONT, or the partition healed) while that grant
// is held, the stopped waiter finds its entry gone and queues again: it is
// granted only after the release, never beside the holder.
func TestMutexWaitStoppedWaiter(t *testing.T) {
	if spec := os.Getenv(mutexChildEnv); spec != "" {
		mutexChild(spec)
		return
	}
	for _, c := range []struct {
		name       string
		stop, cont func(cmd *exec.Cmd, p *faultproxy.Proxy) error
	}{
		{"sigstop",
			func(cmd *exec.Cmd, _ *faultproxy.Proxy) error { return cmd.Process.Signal(syscall.SIGSTOP) },
			func(cmd *exec.Cmd, _ *faultproxy.Proxy) error { return cmd.Process.Signal(syscall.SIGCONT) }},
		{"cut",
			func(_ *exec.Cmd, p *faultproxy.Proxy) error { p.Blackhole(); return nil },
			func(_ *exec.Cmd, p *faultproxy.Proxy) error { p.Heal(); return nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := faultproxy.New(strings.TrimPrefix(testURL(t), "etcd://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			stoppedWaiter(t, "etcd://"+p.Addr(), func(cmd *exec.Cmd) error { return c.stop(cmd, p) }, func(cmd *exec.Cmd) error { return c.cont(cmd, p) })
		})
	}
}

// stoppedWaiter is TestMutexWaitStoppedWaiter with the child on childURL,
// stopped and resumed by stop and cont.
func stoppedWaiter(t *testing.T, childURL string, stop, cont func(*exec.Cmd) error) {
	ctx := testCtx(t)
	const key = "stopped-waiter"
	ds, ls, lk, cmd, out := childFirstInQueue(t, key, 2, childURL)
	lines := make(chan string, 1)
	go func() {
		line, _ := out.ReadString('\n')
		lines <- line
	}()
	granted := make(chan *locker.Lock, 1)
	failed := make(chan error, 1)
	go func() {
		lk, err := ls[1].Acquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			failed <- err
			return
		}
		granted <- lk
	}()
	waitMutexQueued(t, ds[0], key, 2)
	if err := stop(cmd); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	secs := time.Duration(ds[0].waitSecs()) * time.Second
	var held *locker.Lock
	select {
	case err := <-failed:
		t.Fatalf("the waiter behind the stopped one: %v", err)
	case held = <-granted:
		t.Logf("the waiter behind the stopped one was granted %v after the stop", time.Since(stopped))
	case <-time.After(secs + expiryBound + 2*time.Second):
		t.Fatal("the waiter behind the stopped one was not granted")
	}
	if err := cont(cmd); err != nil {
		t.Fatal(err)
	}
	// The resumed waiter queues again behind the holder.
	waitMutexQueued(t, ds[0], key, 1)
	select {
	case line := <-lines:
		t.Fatalf("the resumed waiter returned while the other holds the key: %q", line)
	case <-time.After(500 * time.Millisecond):
	}
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-lines:
		if line != "returned: <nil>\n" {
			t.Fatalf("the resumed waiter: %q", line)
		}
		t.Logf("the resumed waiter was granted %v after the release", time.Since(released))
	case <-time.After(5 * time.Second):
		t.Fatal("the resumed waiter was not granted after the release")
	}
}

// A queued waiter's connections are reset, on both sides or on the
// client's alone (its server-side connection left open and silent). The
// client connects again, its wait lease is still renewed, and it keeps its
// place: at the release it is granted before the waiter that queued after
// it, within 1s.
func TestMutexWaitResetWaiter(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(p *faultproxy.Proxy) int
	}{
		{"both-sides", (*faultproxy.Proxy).Reset},
		{"client-side", func(p *faultproxy.Proxy) int { return p.ResetSide(faultproxy.Client) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			const key = "reset-waiter"
			p, err := faultproxy.New(strings.TrimPrefix(testURL(t), "etcd://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = p.Close() })
			h := openShared(t, 2)
			b := locker.New(openURL(t, "etcd://"+p.Addr()+h[0].Prefix()))
			a, c2 := locker.New(h[0]), locker.New(h[1])
			lk, err := a.Acquire(ctx, key, locker.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			order := make(chan string, 2)
			wait := func(name string, l *locker.Locker) {
				lk, err := l.Acquire(ctx, key, locker.WithTTL(time.Minute))
				if err != nil {
					order <- "error: " + err.Error()
					return
				}
				order <- name
				_ = lk.Release(ctx)
			}
			go wait("proxied", b)
			waitMutexQueued(t, h[0], key, 1)
			go wait("direct", c2)
			waitMutexQueued(t, h[0], key, 2)
			if n := c.fault(p); n == 0 {
				t.Fatal("no connection to reset")
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatal(err)
			}
			released := time.Now()
			var got []string
			for range 2 {
				select {
				case o := <-order:
					got = append(got, o)
				case <-time.After(10 * time.Second):
					t.Fatalf("granted so far: %v", got)
				}
				if len(got) == 1 {
					t.Logf("first grant %v after the release", time.Since(released))
					if d := time.Since(released); d > time.Second {
						t.Errorf("first grant %v after the release, want within 1s", d)
					}
				}
			}
			if fmt.Sprint(got) != "[proxied direct]" {
				t.Errorf("granted in the order %v, want the reset waiter first", got)
			}
		})
	}
}
