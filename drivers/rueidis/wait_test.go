package rueidis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// cmdCalls returns the calls= count of INFO commandstats for cmd (e.g. "get").
func cmdCalls(t testing.TB, s *redistest.Server, cmd string) int {
	t.Helper()
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	info, _ := v.(string)
	for _, line := range strings.Split(info, "\r\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
			return n
		}
	}
	return 0
}

func expectWake(t testing.TB, wake <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-wake:
	case <-time.After(d):
		t.Fatalf("no wake-up within %v after %s", d, what)
	}
}

// drain empties a wake channel (spurious wake-ups are allowed).
func drain(wake <-chan struct{}) {
	select {
	case <-wake:
	default:
	}
}

func TestWaitWokenByExpiry(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	if _, err := a.Acquire(ctx, "exp", newOwner(), 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	wake, cancel, err := b.Subscribe(ctx, "exp")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	drain(wake)
	// The server pushes the invalidation when it expires the key (active
	// expiry runs about every 100ms): generous upper bound.
	expectWake(t, wake, 10*time.Second, "expiry")
	if _, err := b.Acquire(ctx, "exp", newOwner(), time.Second); err != nil {
		t.Fatalf("acquire after expiry wake-up: %v", err)
	}
}

// Many local subscribers of one key share one tracking read, and a release
// wakes every one of them with O(1) commands on the server. (Tracking reads
// are counted by the ECHO rueidis sends with each DoCache read in OPTOUT
// mode: commandstats also counts the GETs the scripts make.)
func TestWaitSharedSubscription(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	oa := newOwner()
	if _, err := a.Acquire(ctx, "shared", oa, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	before := cmdCalls(t, s, "echo")
	const n = 50
	wakes := make([]<-chan struct{}, n)
	cancels := make([]func(), n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, c, err := b.Subscribe(ctx, "shared")
			if err != nil {
				t.Error(err)
				return
			}
			wakes[i], cancels[i] = w, c
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	if got := cmdCalls(t, s, "echo") - before; got != 1 {
		t.Errorf("%d subscribers made %d tracking reads, want 1 shared one", n, got)
	}
	for _, w := range wakes {
		drain(w)
	}
	before = cmdCalls(t, s, "echo")
	if err := a.Release(ctx, "shared", oa); err != nil {
		t.Fatal(err)
	}
	for _, w := range wakes {
		expectWake(t, w, 10*time.Second, "release")
	}
	// Nobody retries here, so the watch re-arms with its own read after
	// rearmGrace: one read for all n subscribers.
	drivertest.WaitFor(t, 10*time.Second, "re-arm", func() bool { return trackedByCache(b, "shared") })
	if got := cmdCalls(t, s, "echo") - before; got != 1 {
		t.Errorf("one release caused %d tracking reads from %d subscribers, want 1", got, n)
	}
	// Re-armed: an overwrite and then a release wake them again.
	ob := newOwner()
	for _, w := range wakes {
		drain(w)
	}
	if _, err := a.Acquire(ctx, "shared", ob, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wakes[0], 10*time.Second, "re-acquire (overwrite)")
	drivertest.WaitFor(t, 10*time.Second, "re-arm", func() bool { return trackedByCache(b, "shared") })
	drain(wakes[0])
	if err := a.Release(ctx, "shared", ob); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wakes[0], 10*time.Second, "second release")
}

// An acquire attempt on a watched key re-arms the watch in the same round
// trip (its EVALSHA runs on the tracking connection), so package locker's
// retry after a wake-up needs no extra read.
func TestWaitAcquireRearms(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	oa := newOwner()
	if _, err := a.Acquire(ctx, "pig", oa, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	wake, cancel, err := b.Subscribe(ctx, "pig")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	drain(wake)
	for round := range 3 {
		if err := a.Release(ctx, "pig", oa); err != nil {
			t.Fatal(err)
		}
		expectWake(t, wake, 10*time.Second, "release")
		oa = newOwner()
		if _, err := a.Acquire(ctx, "pig", oa, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// b retries, as package locker would, and loses: that attempt
		// re-arms the watch.
		_, err := b.Acquire(ctx, "pig", newOwner(), time.Second)
		if !errors.Is(err, driver.ErrNotAcquired) {
			t.Fatalf("round %d: %v", round, err)
		}
		if !trackedByCache(b, "pig") {
			t.Fatalf("round %d: the losing attempt did not re-arm the watch", round)
		}
		drain(wake)
	}
}

// A subscriber that arrives while the key is free is woken at once; a
// release by the same Locker wakes its own subscribers (no NOLOOP).
func TestWaitSameLocker(t *testing.T) {
	s := redistest.Start(t)
	a := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	wake, cancel, err := a.Subscribe(ctx, "self")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	expectWake(t, wake, time.Second, "subscribing to a free key")
	o := newOwner()
	if _, err := a.Acquire(ctx, "self", o, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wake, 10*time.Second, "acquire (the key changed)")
	// Re-armed asynchronously; wait until the server tracks the key again.
	drivertest.WaitFor(t, 10*time.Second, "tracking", func() bool { return trackedByCache(a, "self") })
	drain(wake)
	if err := a.Release(ctx, "self", o); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wake, 10*time.Second, "own release")
}

// trackedByCache reports whether the Locker's watch of key is armed, i.e.
// the server tracks the key for it.
func trackedByCache(l *Locker, key string) bool {
	lock, _, _ := rediscore.Keys(rediscore.DefaultPrefix, key)
	w := l.w.(*cscWaiter)
	w.mu.Lock()
	defer w.mu.Unlock()
	x := w.keys[lock]
	return x != nil && x.armed
}

// A lost connection wakes every subscriber once, and the watch is re-armed
// on the new connection.
func TestWaitConnectionLoss(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	o := newOwner()
	if _, err := a.Acquire(ctx, "loss", o, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "other", newOwner(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	wake, cancel, err := b.Subscribe(ctx, "loss")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	drain(wake)
	// Kill b's watch connection.
	watch := b.w.(*cscWaiter).clients[0]
	id, err := watch.Do(ctx, watch.B().ClientId().Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Do("CLIENT", "KILL", "ID", strconv.FormatInt(id, 10)); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wake, 10*time.Second, "connection loss")
	drivertest.WaitFor(t, 10*time.Second, "re-arm after reconnect", func() bool { return trackedByCache(b, "loss") })
	drain(wake)
	if err := a.Release(ctx, "loss", o); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wake, 10*time.Second, "release after reconnect")
}

// An adopted client waits on pub/sub: one SUBSCRIBE per key and process.
func TestWaitAdoptedPubSub(t *testing.T) {
	s := redistest.Start(t)
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	b, err := New(context.Background(), cl, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	o := newOwner()
	if _, err := a.Acquire(ctx, "ps", o, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	lock, _, channel := rediscore.Keys("", "ps")
	_ = lock
	var wakes []<-chan struct{}
	var cancels []func()
	for range 10 {
		w, c, err := b.Subscribe(ctx, "ps")
		if err != nil {
			t.Fatal(err)
		}
		wakes, cancels = append(wakes, w), append(cancels, c)
	}
	numsub := func() int64 {
		v, err := s.Do("PUBSUB", "NUMSUB", channel)
		if err != nil {
			t.Fatal(err)
		}
		n, _ := v.([]any)[1].(int64)
		return n
	}
	if n := numsub(); n != 1 {
		t.Fatalf("PUBSUB NUMSUB = %d, want 1 shared subscription", n)
	}
	if err := a.Release(ctx, "ps", o); err != nil {
		t.Fatal(err)
	}
	for _, w := range wakes {
		expectWake(t, w, 10*time.Second, "release")
	}
	for _, c := range cancels {
		c()
		c()
	}
	drivertest.WaitFor(t, 10*time.Second, "UNSUBSCRIBE", func() bool { return numsub() == 0 })
	// The adopted client is still usable after Close.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cl.Do(ctx, cl.B().Ping().Build()).Error(); err != nil {
		t.Fatalf("adopted client closed by Locker.Close: %v", err)
	}
}

func TestSubscribeCancelledContext(t *testing.T) {
	s := redistest.Start(t)
	a := openT(t, urlOf(s.Addr))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := a.Subscribe(ctx, "k"); err == nil || !strings.Contains(err.Error(), context.Canceled.Error()) {
		t.Fatalf("Subscribe with a cancelled ctx: %v", err)
	}
	if _, _, err := a.Subscribe(context.Background(), ""); err == nil {
		t.Fatal("Subscribe with an empty key succeeded")
	}
}

// The watch client tracks with NOLOOP, so the server tells this process
// nothing of the writes its own refreshes make. A refresh that shortens
// the TTL still wakes the key's subscribers in this process at once (not
// when the key next changes), and a refresh that finds the key gone (its
// read expired it, which NOLOOP would keep quiet) wakes them (that the
// hold watch reports it is TestHoldWatchExpiredByOwnRefresh).
func TestOwnRefreshTellsThisProcess(t *testing.T) {
	s := redistest.Start(t, "--enable-debug-command", "yes")
	if _, err := s.Do("DEBUG", "SET-ACTIVE-EXPIRE", "0"); err != nil {
		t.Fatal(err)
	}
	a := openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	o := newOwner()
	if _, err := a.Acquire(ctx, "short", o, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	wake, cancel, err := a.Subscribe(ctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	drivertest.WaitFor(t, 10*time.Second, "tracking", func() bool { return trackedByCache(a, "short") })
	drain(wake)
	if err := a.Refresh(ctx, "short", o, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	expectWake(t, wake, time.Second, "a refresh to a shorter TTL")

	const ttl = 100 * time.Millisecond
	if _, err := a.Acquire(ctx, "gone", o, ttl); err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(ttl)
	wake2, cancel2, err := a.Subscribe(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel2()
	drivertest.WaitFor(t, 10*time.Second, "tracking", func() bool { return trackedByCache(a, "gone") })
	drain(wake2)
	// Active expiry is off, so the key stays until a read expires it: the
	// wait is for the server's clock to pass the TTL, not for an event.
	time.Sleep(time.Until(expires) + 20*time.Millisecond)
	if err := a.Refresh(ctx, "gone", o, 30*time.Second); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh of an expired key: %v, want ErrNotHeld", err)
	}
	expectWake(t, wake2, time.Second, "a refresh that expired the key")
}
