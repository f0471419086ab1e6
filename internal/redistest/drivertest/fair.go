package drivertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// Deployment is a Redis deployment for the fair-queue scenarios: its URL
// and the servers that may hold the queue (every Cluster master).
type Deployment struct {
	URL     string
	Servers []*redistest.Server
	// Prefix is the key prefix URL sets; "" for the default.
	Prefix string
}

// queueLen returns the number of waiters queued for key (LLEN of its
// queue list, on whichever server holds it).
func (d Deployment) queueLen(t testing.TB, key string) int64 {
	lock, _, _ := rediscore.Keys(d.Prefix, key)
	ql, _ := rediscore.QueueKeys(lock)
	var n int64
	for _, s := range d.Servers {
		if v, err := s.Do("LLEN", ql); err == nil {
			x, _ := v.(int64)
			n += x
		}
	}
	return n
}

// queueHead returns the first element of key's queue, or "".
func (d Deployment) queueHead(t testing.TB, key string) string {
	lock, _, _ := rediscore.Keys(d.Prefix, key)
	ql, _ := rediscore.QueueKeys(lock)
	for _, s := range d.Servers {
		if v, err := s.Do("LINDEX", ql, "0"); err == nil {
			if el, ok := v.(string); ok {
				return el
			}
		}
	}
	return ""
}

// queueKeys returns how many of key's queue keys exist.
func (d Deployment) queueKeys(key string) int64 {
	lock, _, _ := rediscore.Keys(d.Prefix, key)
	ql, qz := rediscore.QueueKeys(lock)
	var n int64
	for _, s := range d.Servers {
		for _, k := range []string{ql, qz} {
			if v, err := s.Do("EXISTS", k); err == nil {
				x, _ := v.(int64)
				n += x
			}
		}
	}
	return n
}

// waitFor polls cond every 2ms until it holds, failing the test after d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// queued starts Acquire of key on l in a goroutine, once the queue holds
// want-1 waiters, and returns when the queue holds want: the waiter is
// then the want-th in line. The grant (or error) arrives on the returned
// channel.
func queued(t *testing.T, d Deployment, l *locker.Locker, key string, want int64) <-chan *locker.Lock {
	t.Helper()
	got := make(chan *locker.Lock, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		lk, err := l.Acquire(ctx, key, locker.WithTTL(10*time.Second))
		if err != nil {
			t.Errorf("waiter %d: %v", want, err)
		}
		got <- lk
	}()
	waitFor(t, 10*time.Second, fmt.Sprintf("waiter %d in the queue", want), func() bool { return d.queueLen(t, key) == want })
	return got
}

// acquired is the outcome of an Acquire run in the background.
type acquired struct {
	lk  *locker.Lock
	at  time.Time // when Acquire returned
	err error
}

// acquireAsync runs l.Acquire(ctx, key) with ttl in the background.
func acquireAsync(ctx context.Context, l *locker.Locker, key string, ttl time.Duration) <-chan acquired {
	c := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, locker.WithTTL(ttl))
		c <- acquired{lk, time.Now(), err}
	}()
	return c
}

// FairOrder: a holder and n waiters, each its own Locker (a process of its
// own), queued one after another; releases grant them in arrival order,
// and each waiter's release hands the key to the next.
func FairOrder(t *testing.T, d Deployment, n int) {
	urls := make([]string, n)
	for i := range urls {
		urls[i] = d.URL
	}
	FairOrderAcross(t, d, urls...)
}

// FairOrderAcross is FairOrder with the i-th waiter opened on waiterURLs[i]
// (another driver, say), on the same deployment.
func FairOrderAcross(t *testing.T, d Deployment, waiterURLs ...string) {
	key := "fair-order"
	n := len(waiterURLs)
	holder := Open(t, d.URL)
	lk, err := holder.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	var mu sync.Mutex
	done := make([]<-chan *locker.Lock, n)
	for i := range n {
		done[i] = queued(t, d, Open(t, waiterURLs[i]), key, int64(i+1))
	}
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		select {
		case g := <-done[i]:
			if g == nil {
				t.FailNow()
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			// Nobody else may hold it meanwhile: the others are queued.
			for j := i + 1; j < n; j++ {
				select {
				case <-done[j]:
					t.Fatalf("waiter %d granted while waiter %d holds the key (order so far %v)", j, i, order)
				default:
				}
			}
			if err := g.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not granted within 10s after its predecessor released (order so far %v)", i, order)
		}
	}
	waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
}

// FairCancel: a waiter whose ctx ends leaves the queue at once, and a
// release then frees the key (nothing reserved for the gone waiter).
func FairCancel(t *testing.T, d Deployment) {
	key := "fair-cancel"
	holder := Open(t, d.URL)
	lk, err := holder.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	w := Open(t, d.URL)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := w.Acquire(ctx, key)
		errc <- err
	}()
	waitFor(t, 10*time.Second, "the waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Acquire = %v, want context.Canceled", err)
		}
	case <-time.After(time.Second):
		t.Fatal("Acquire did not return within 1s of its ctx's end")
	}
	waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	other, err := Open(t, d.URL).TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatalf("after the release, TryAcquire = %v: something was left reserved", err)
	}
	_ = other.Release(context.Background())
}

// FairMany: n waiting Lockers all get the key, each once, one at a time.
func FairMany(t *testing.T, d Deployment, n int) {
	key := "fair-many"
	var holding, granted sync.WaitGroup
	var inside, maxInside int
	var mu sync.Mutex
	lockers := make([]*locker.Locker, n)
	for i := range lockers {
		lockers[i] = Open(t, d.URL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	granted.Add(n)
	for _, l := range lockers {
		holding.Go(func() {
			lk, err := l.Acquire(ctx, key, locker.WithTTL(10*time.Second))
			if err != nil {
				t.Error(err)
				granted.Done()
				return
			}
			mu.Lock()
			inside++
			maxInside = max(maxInside, inside)
			mu.Unlock()
			time.Sleep(time.Millisecond) // the critical section
			mu.Lock()
			inside--
			mu.Unlock()
			if err := lk.Release(context.Background()); err != nil {
				t.Error(err)
			}
			granted.Done()
		})
	}
	holding.Wait()
	if maxInside != 1 {
		t.Fatalf("%d holders at once", maxInside)
	}
	waitFor(t, 5*time.Second, "the queue keys to go", func() bool { return d.queueKeys(key) == 0 })
}

// FairHeadTakesOver: a waiter that becomes first in line without being
// woken (the one before it was granted the key, or left) is told how long
// the holder has, so it takes over right after a holder that stops
// renewing, not at its next heartbeat (queue_ttl/2, over 1s here). Twice,
// with TTL 300ms and the holder cut off through px (proxied opens a Locker
// through it): the first in line is granted and cut off, then the first
// in line leaves and the holder is cut off. Each time the waiter behind it
// must be granted within TTL + 300ms of the cut.
func FairHeadTakesOver(t *testing.T, d Deployment, queueTTL time.Duration, px *faultproxy.Proxy, proxied string) {
	const ttl = 300 * time.Millisecond
	if queueTTL < 3*time.Second {
		t.Fatalf("queue_ttl %v: want at least 3s, so that a heartbeat cannot pass for the nudge", queueTTL)
	}
	bound := ttl + 300*time.Millisecond
	grantedBy := func(t *testing.T, c <-chan acquired, cut time.Time, what string) *locker.Lock {
		t.Helper()
		select {
		case r := <-c:
			if r.err != nil {
				t.Fatalf("%s: %v", what, r.err)
			}
			took := time.Since(cut)
			t.Logf("%s granted %v after the cut (TTL %v)", what, took.Round(time.Millisecond), ttl)
			if took > bound {
				t.Fatalf("%s granted %v after the holder was cut off; want within %v", what, took, bound)
			}
			return r.lk
		case <-time.After(queueTTL + 5*time.Second):
			t.Fatalf("%s never granted", what)
			return nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("after-grant", func(t *testing.T) {
		key := "fair-head-grant"
		holder, err := Open(t, d.URL).TryAcquire(ctx, key, locker.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		first := acquireAsync(ctx, Open(t, proxied), key, ttl)
		waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
		second := acquireAsync(ctx, Open(t, d.URL), key, ttl)
		waitFor(t, 10*time.Second, "the second waiter in the queue", func() bool { return d.queueLen(t, key) == 2 })
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-first
		if r.err != nil {
			t.Fatal(r.err)
		}
		px.Blackhole()
		defer px.Heal()
		lk := grantedBy(t, second, time.Now(), "the second waiter")
		_ = lk.Release(ctx)
	})
	t.Run("after-leave", func(t *testing.T) {
		key := "fair-head-leave"
		px.Heal()
		if _, err := Open(t, proxied).TryAcquire(ctx, key, locker.WithTTL(ttl)); err != nil {
			t.Fatal(err)
		}
		lctx, leave := context.WithCancel(ctx)
		first := acquireAsync(lctx, Open(t, d.URL), key, ttl)
		waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
		second := acquireAsync(ctx, Open(t, d.URL), key, ttl)
		waitFor(t, 10*time.Second, "the second waiter in the queue", func() bool { return d.queueLen(t, key) == 2 })
		leave()
		if r := <-first; r.err == nil {
			t.Fatal("the first waiter was granted; want its wait cancelled")
		}
		waitFor(t, 10*time.Second, "the first waiter out of the queue", func() bool { return d.queueLen(t, key) == 1 })
		px.Blackhole()
		defer px.Heal()
		lk := grantedBy(t, second, time.Now(), "the second waiter")
		_ = lk.Release(ctx)
	})
}

// churnGapBound is the longest gap FairChurn allows between grants. When
// the machine is loaded, most waits of 1–20ms end before their grant's
// round trip does: a gap of 2.2s with no lapse was seen (7 grants, 1,928
// cancelled waits in 3s), so the bound stands above that, and below the
// 5s queue_ttl a missed hand-over would take to lapse.
const churnGapBound = 3 * time.Second

// FairChurn: n Lockers take one key over and over for about d, each wait
// bounded by a random timeout of 1 to 20ms (so many waits are cancelled:
// queued, reserved or just granted when their context ends) and each hold
// random up to 2ms. Asserted: never two holders at once, fencing tokens
// strictly increasing in grant order, some waits granted and some
// cancelled, every Acquire error a context error, no gap of
// churnGapBound between grants, nor after the last one (d.URL should set a
// queue_ttl over churnGapBound: a hand-over missed by a cancelled wait
// would then show as a reservation lapsing), and no queue key or lock left
// at the end.
func FairChurn(t *testing.T, d Deployment, n int, dur time.Duration) {
	key := "fair-churn"
	lockers := make([]*locker.Locker, n)
	for i := range lockers {
		lockers[i] = Open(t, d.URL)
	}
	var (
		mu              sync.Mutex
		inside          bool
		last            uint64
		grants, cancels int
		lastAt          time.Time
		maxGap          time.Duration
		wg              sync.WaitGroup
		end             = time.Now().Add(dur)
	)
	for i, l := range lockers {
		wg.Go(func() {
			r := mrand.New(mrand.NewPCG(uint64(i), uint64(time.Now().UnixNano())))
			for time.Now().Before(end) && !t.Failed() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+r.IntN(20))*time.Millisecond)
				lk, err := l.Acquire(ctx, key, locker.WithTTL(10*time.Second))
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("Acquire: %v", err)
						return
					}
					mu.Lock()
					cancels++
					mu.Unlock()
					continue
				}
				mu.Lock()
				if inside {
					t.Errorf("two holders at once (token %d)", lk.Token())
				}
				if lk.Token() <= last {
					t.Errorf("token %d after %d", lk.Token(), last)
				}
				inside, last = true, lk.Token()
				now := time.Now()
				if grants > 0 {
					maxGap = max(maxGap, now.Sub(lastAt))
				}
				lastAt = now
				grants++
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond) // the critical section
				mu.Lock()
				inside = false
				mu.Unlock()
				if err := lk.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	if grants > 0 {
		maxGap = max(maxGap, end.Sub(lastAt)) // the waits went on until end
	}
	t.Logf("%d grants, %d cancelled waits, longest gap between grants %v", grants, cancels, maxGap.Round(time.Millisecond))
	if grants == 0 || cancels == 0 {
		t.Fatalf("%d grants and %d cancelled waits: want some of each", grants, cancels)
	}
	if maxGap > churnGapBound {
		t.Fatalf("%v between two grants: a hand-over was missed", maxGap)
	}
	lock, _, _ := rediscore.Keys("", key)
	waitFor(t, 10*time.Second, "the queue keys and the lock to go", func() bool {
		if d.queueKeys(key) != 0 {
			return false
		}
		for _, s := range d.Servers {
			if v, err := s.Do("EXISTS", lock); err != nil || v != int64(0) {
				return false
			}
		}
		return true
	})
}

// Child process support for FairKilledWaiter and the crashed holders of
// OddKeys and FairFreed.
const (
	childURLEnv  = "LOCKER_FAIR_CHILD_URL"
	childKeyEnv  = "LOCKER_FAIR_CHILD_KEY"   // Go-quoted
	childOwnEnv  = "LOCKER_FAIR_CHILD_OWNER" // optional, Go-quoted
	childTTLEnv  = "LOCKER_FAIR_CHILD_TTL"   // optional, a time.Duration
	childModeEnv = "LOCKER_FAIR_CHILD_MODE"  // "" (wait), "hold" or "permit"
)

// MaybeChild runs the child of FairKilledWaiter and of crashed holders
// when the test binary was started as one, and exits; otherwise it returns
// at once. Call it first in TestMain.
//
// The default child prints "waiting", waits for the key (Acquire), prints
// "acquired" and exits without releasing. The "hold" child prints "ready",
// reads a line, takes the key (TryAcquire, no renewal), prints "held",
// then reads one more line: "refresh <duration>" refreshes to that TTL and
// prints "refreshed"; anything else does nothing; then it exits without
// releasing. The "permit" child holds a permit (see sharedChild) until
// killed. For a crash, kill the child once it printed what it did: a
// child still exiting could release the key at its safe deadline.
func MaybeChild() {
	u := os.Getenv(childURLEnv)
	if u == "" {
		return
	}
	l, err := locker.OpenURL(u)
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	opts := []locker.Option{locker.WithAutoRenew(false)}
	if o, err := strconv.Unquote(os.Getenv(childOwnEnv)); err == nil {
		opts = append(opts, locker.WithOwner(o))
	}
	if d, err := time.ParseDuration(os.Getenv(childTTLEnv)); err == nil {
		opts = append(opts, locker.WithTTL(d))
	}
	key, _ := strconv.Unquote(os.Getenv(childKeyEnv))
	if os.Getenv(childModeEnv) == "permit" {
		sharedChild(l, key, append(opts, locker.WithAutoRenew(true)))
		os.Exit(1)
	}
	if os.Getenv(childModeEnv) != "hold" {
		fmt.Println("waiting")
		lk, err := l.Acquire(context.Background(), key, opts...)
		fmt.Println("acquired", lk != nil, err)
		os.Exit(0)
	}
	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	in.Scan()
	lk, err := l.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		fmt.Println("acquire:", err)
		os.Exit(1)
	}
	fmt.Println("held")
	in.Scan()
	if d, ok := strings.CutPrefix(in.Text(), "refresh "); ok {
		ttl, _ := time.ParseDuration(d)
		fmt.Println("refreshed", lk.Refresh(context.Background(), ttl))
	}
	os.Exit(0)
}

// child is a test binary started as MaybeChild's child.
type child struct {
	t     *testing.T
	cmd   *exec.Cmd
	in    io.Writer
	lines *bufio.Scanner
}

// startChild starts a child (see MaybeChild) with the given environment
// (NAME=value pairs added to the child constants'); it is killed at the
// end of the test.
func startChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return &child{t: t, cmd: cmd, in: in, lines: bufio.NewScanner(out)}
}

// expect fails unless the child's next line starts with want.
func (c *child) expect(want string) {
	c.t.Helper()
	if !c.lines.Scan() || !strings.HasPrefix(c.lines.Text(), want) {
		c.t.Fatalf("child: %q, want %q", c.lines.Text(), want)
	}
}

// kill kills the child: a crash.
func (c *child) kill() {
	c.t.Helper()
	if err := c.cmd.Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
}

// say sends the child a line.
func (c *child) say(line string) {
	c.t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		c.t.Fatal(err)
	}
}

// waitUnheard waits until nobody listens on the wake channel of queue
// element el on d's first server: the server has read the closed
// connections of el's Locker.
func waitUnheard(t *testing.T, d Deployment, el, what string) {
	t.Helper()
	wid, _, _ := strings.Cut(el, ":")
	ch := rediscore.WakeChannel("", wid)
	waitFor(t, 10*time.Second, "the server to drop "+what+"'s subscription", func() bool {
		v, err := d.Servers[0].Do("PUBSUB", "NUMSUB", ch)
		a, _ := v.([]any)
		return err == nil && len(a) == 2 && a[1] == int64(0)
	})
}

// grantedWithin waits for the waiter behind a failed one (next, queued
// by queued) and fails unless it was granted within bound of released.
// behind names the failed waiter in messages.
func grantedWithin(t *testing.T, next <-chan *locker.Lock, released time.Time, bound, queueTTL time.Duration, behind string) *locker.Lock {
	t.Helper()
	select {
	case g := <-next:
		took := time.Since(released)
		if g == nil {
			t.FailNow()
		}
		t.Logf("next waiter granted %v after the release (queue_ttl %v)", took.Round(time.Millisecond), queueTTL)
		if took > bound {
			t.Fatalf("next waiter granted %v after the release; want within %v (queue_ttl %v)", took, bound, queueTTL)
		}
		return g
	case <-time.After(queueTTL + 5*time.Second):
		t.Fatalf("the waiter behind %s was never granted", behind)
		return nil
	}
}

// FairKilledWaiter: a waiter queued in another process is SIGKILLed while
// first in line, then the holder releases. With gone (a single server or
// Sentinel), the release sees that nobody listens on the dead waiter's
// wake channel and hands the key to the next waiter at once: granted
// within 1s, where queueTTL (d.URL's queue_ttl) must be longer. Without
// (a Cluster, where PUBLISH counts one node's subscribers), the dead
// waiter's entry lapses after queueTTL and the next waiter is granted then
// (within queueTTL + 500ms), not stuck.
func FairKilledWaiter(t *testing.T, d Deployment, queueTTL time.Duration, gone bool) {
	key := "fair-killed"
	holder := Open(t, d.URL)
	lk, err := holder.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	c := startChild(t, childURLEnv+"="+d.URL, childKeyEnv+"="+strconv.Quote(key))
	c.expect("waiting")
	cmd := c.cmd
	waitFor(t, 10*time.Second, "the child in the queue", func() bool { return d.queueLen(t, key) == 1 })
	el := d.queueHead(t, key)
	if sure := !strings.HasPrefix(el, "~"); sure != gone {
		t.Fatalf("the child's queue element %q: want receiver-checked %v", el, gone)
	}
	next := queued(t, d, Open(t, d.URL), key, 2)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	bound := queueTTL + 500*time.Millisecond
	if gone {
		waitUnheard(t, d, el, "the killed child")
		bound = time.Second
		if queueTTL <= 2*bound {
			t.Fatalf("queue_ttl %v too short to tell a skipped entry from a lapsed one", queueTTL)
		}
	}
	released := time.Now()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	g := grantedWithin(t, next, released, bound, queueTTL, "a killed one")
	_ = g.Release(context.Background())
}

// FairResetWaiter: the first waiter in line loses its connections (reset
// through its fault proxy, which then refuses new ones) while the key is
// held, so nobody listens on its wake channel any more. The release skips
// it and grants the next waiter at once (within 1s; queueTTL, d.URL's
// queue_ttl, must be longer). Once its connections are back the skipped
// waiter joins the queue again and is granted after that waiter, never
// while it holds the key. proxied opens a Locker through the proxy.
func FairResetWaiter(t *testing.T, d Deployment, queueTTL time.Duration, px *faultproxy.Proxy, proxied string) {
	key := "fair-reset"
	holder := Open(t, d.URL)
	lk, err := holder.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	resetl := Open(t, proxied)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	resetGot := acquireAsync(ctx, resetl, key, 10*time.Second)
	waitFor(t, 10*time.Second, "the first waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
	el := d.queueHead(t, key)
	next := queued(t, d, Open(t, d.URL), key, 2)
	px.Refuse(true)
	px.Reset()
	waitUnheard(t, d, el, "the reset waiter")
	if queueTTL <= 2*time.Second {
		t.Fatalf("queue_ttl %v too short to tell a skipped entry from a lapsed one", queueTTL)
	}
	released := time.Now()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	g := grantedWithin(t, next, released, time.Second, queueTTL, "a reset one")
	px.Refuse(false)
	waitFor(t, 20*time.Second, "the reset waiter back in the queue", func() bool { return d.queueLen(t, key) == 1 })
	select {
	case r := <-resetGot:
		t.Fatalf("the reset waiter's Acquire returned (%v, %v) while the next waiter holds the key", r.lk != nil, r.err)
	default:
	}
	freed := time.Now()
	if err := g.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-resetGot:
		if r.err != nil {
			t.Fatalf("the reset waiter: %v", r.err)
		}
		t.Logf("the reset waiter granted %v after the next one released", r.at.Sub(freed).Round(time.Millisecond))
		_ = r.lk.Release(context.Background())
	case <-time.After(10 * time.Second):
		t.Fatal("the reset waiter was not granted within 10s of the release")
	}
}

// FairCutWaiter: the first waiter in line is cut off (its connections
// blackholed by a fault proxy) when the holder releases; the lock reserved
// for it lapses with its entry, and the next waiter is granted within
// queue_ttl. proxied opens a Locker on the deployment through the proxy.
func FairCutWaiter(t *testing.T, d Deployment, queueTTL time.Duration, px *faultproxy.Proxy, proxied string) {
	key := "fair-cut"
	holder := Open(t, d.URL)
	lk, err := holder.TryAcquire(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	cutl := Open(t, proxied)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cutGot := make(chan error, 1)
	go func() {
		lk, err := cutl.Acquire(ctx, key)
		if err == nil {
			_ = lk.Release(context.Background())
		}
		cutGot <- err
	}()
	waitFor(t, 10*time.Second, "the cut waiter in the queue", func() bool { return d.queueLen(t, key) == 1 })
	next := queued(t, d, Open(t, d.URL), key, 2)
	px.Blackhole()
	released := time.Now()
	if err := lk.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	g := grantedWithin(t, next, released, queueTTL+500*time.Millisecond, queueTTL, "a cut-off one")
	select {
	case err := <-cutGot:
		t.Fatalf("the cut-off waiter's Acquire returned (%v) while the next one holds the key", err)
	default:
	}
	_ = g.Release(context.Background())
	px.Heal()
	cancel()
	<-cutGot
}

// Fair runs every fair-queue scenario on the driver whose URLs u spells:
// on one server order, cancellation, 64 waiters, a killed waiter and one
// whose connections were reset (each skipped at once, queue_ttl=5s) and a
// cut-off one (lapsed after queue_ttl=600ms); on a Cluster order and a
// killed waiter (lapsed); under Sentinel order and a killed waiter
// (skipped).
func Fair(t *testing.T, u URLs) {
	const queueTTL = 600 * time.Millisecond
	q := "queue_ttl=600ms"
	s := redistest.Start(t)
	d := Deployment{URL: With(u.Of(s.Addr), q), Servers: []*redistest.Server{s}}
	t.Run("order", func(t *testing.T) { FairOrder(t, d, 6) })
	t.Run("cancel", func(t *testing.T) { FairCancel(t, d) })
	t.Run("64-waiters", func(t *testing.T) { FairMany(t, d, 64) })
	// long is d with queue_ttl=5s: a waiter skipped or nudged at once is
	// then told apart from one whose entry lapsed.
	long := Deployment{URL: With(u.Of(s.Addr), "queue_ttl=5s"), Servers: d.Servers}
	// proxy starts a fault proxy to s for one subtest and returns it with
	// the URL of a Locker through it (params added).
	proxy := func(t *testing.T, params ...string) (*faultproxy.Proxy, string) {
		px, err := faultproxy.New(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { px.Close() })
		return px, With(u.Of(px.Addr()), append(params, "dial_timeout=200ms")...)
	}
	// 6s: a lapse (5s) that begins in the first 3s shows as a gap over
	// churnGapBound.
	t.Run("churn", func(t *testing.T) { FairChurn(t, long, 12, 6*time.Second) })
	t.Run("killed-waiter", func(t *testing.T) { FairKilledWaiter(t, long, 5*time.Second, true) })
	t.Run("reset-waiter", func(t *testing.T) {
		px, proxied := proxy(t, "queue_ttl=5s")
		FairResetWaiter(t, long, 5*time.Second, px, proxied)
	})
	t.Run("head-takes-over", func(t *testing.T) {
		px, proxied := proxy(t, "queue_ttl=5s")
		FairHeadTakesOver(t, long, 5*time.Second, px, proxied)
	})
	t.Run("cut-waiter", func(t *testing.T) {
		px, proxied := proxy(t, q)
		FairCutWaiter(t, d, queueTTL, px, proxied)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		cd := Deployment{URL: With(u.Of(c.Addrs()...), "cluster=true", q), Servers: c.Masters}
		FairOrder(t, cd, 4)
		t.Run("killed-waiter", func(t *testing.T) { FairKilledWaiter(t, cd, queueTTL, false) })
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		master := []*redistest.Server{sn.Master}
		FairOrder(t, Deployment{URL: With(u.Of(sn.Sentinel.Addr), "sentinel_master="+sn.Name, q), Servers: master}, 4)
		t.Run("killed-waiter", func(t *testing.T) {
			FairKilledWaiter(t, Deployment{URL: With(u.Of(sn.Sentinel.Addr), "sentinel_master="+sn.Name, "queue_ttl=5s"), Servers: master}, 5*time.Second, true)
		})
	})
}
