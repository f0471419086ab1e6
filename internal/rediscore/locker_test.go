package rediscore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// pubsubWaiter is a Waiter over go-redis pub/sub, one PubSub per wait;
// events records Shut and the Conns' Close, in order.
type pubsubWaiter struct {
	c      redis.UniversalClient
	events *events

	mu    sync.Mutex
	calls [][2]string // lock, channel of each Subscribe
	subs  map[*redis.PubSub]struct{}
}

func (w *pubsubWaiter) Subscribe(ctx context.Context, lock, channel string) (<-chan struct{}, func(), error) {
	ps := w.c.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil { // the confirmation
		ps.Close()
		return nil, nil, err
	}
	w.mu.Lock()
	w.calls = append(w.calls, [2]string{lock, channel})
	w.subs[ps] = struct{}{}
	w.mu.Unlock()
	wake := make(chan struct{}, 1)
	go func() {
		for range ps.Channel() {
			select {
			case wake <- struct{}{}:
			default:
			}
		}
	}()
	var once sync.Once
	return wake, func() { once.Do(func() { ps.Close() }) }, nil
}

func (w *pubsubWaiter) Shut() {
	w.events.add("waiter")
	w.mu.Lock()
	defer w.mu.Unlock()
	for ps := range w.subs {
		ps.Close()
	}
}

type events struct {
	mu   sync.Mutex
	list []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.list = append(e.list, s)
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.list, ",")
}

// closeConn records its Close.
type closeConn struct {
	testConn
	events *events
}

func (c closeConn) Close() error {
	c.events.add("conn")
	return c.testConn.Close()
}

func newTestLocker(t *testing.T, cfg LockerConfig, addrs ...string) (*Locker, *pubsubWaiter) {
	t.Helper()
	ev := &events{}
	for _, a := range addrs {
		cfg.Conns = append(cfg.Conns, closeConn{newTestConn(t, a), ev})
	}
	w := &pubsubWaiter{c: newTestConn(t, addrs[0]).c, events: ev, subs: map[*redis.PubSub]struct{}{}}
	cfg.Waiter = w
	l := NewLocker(cfg)
	t.Cleanup(func() { l.Close() })
	return l, w
}

// Every error the Locker returns starts with its driver's name; Close is
// idempotent, shuts the waiter (before or after the Conns, as configured)
// and makes every method return driver.ErrClosed.
func TestLockerNameAndClose(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, after := range []bool{false, true} {
		l, w := newTestLocker(t, LockerConfig{Name: "rueidis", HoldNeeds: "a watch", WaiterAfterConns: after}, s.Addr)
		prefixed := func(what string, err error) {
			t.Helper()
			if err == nil || !strings.HasPrefix(err.Error(), "rueidis: ") || strings.Contains(strings.ReplaceAll(err.Error(), "rueidis: ", ""), "redis: ") {
				t.Fatalf("%s: %v, want an error starting with \"rueidis: \"", what, err)
			}
		}
		_, err := l.Acquire(ctx, "", "o", time.Second)
		prefixed("empty key", err)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("empty key: %v, want ErrInvalid", err)
		}
		_, err = l.Acquire(ctx, "k", "o", 0)
		prefixed("zero ttl", err)
		err = l.Release(ctx, "k", "o")
		prefixed("release of a free key", err)
		if !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("release: %v, want ErrNotHeld", err)
		}
		_, err = l.Inspect(ctx, "k")
		prefixed("inspect of a free key", err)
		_, _, err = l.Subscribe(ctx, strings.Repeat("k", DefaultMaxKeyLen+1))
		prefixed("subscribe to a long key", err)
		done, stop := context.WithCancel(ctx)
		stop()
		_, _, err = l.Subscribe(done, "k")
		prefixed("subscribe with a done ctx", err)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("subscribe with a done ctx: %v", err)
		}
		_, err = l.WatchHold("k", "o", 1, func(error) {})
		if err == nil || err.Error() != "rueidis: hold watching needs a watch" {
			t.Fatalf("WatchHold without a HoldWatch: %v", err)
		}

		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		want := "waiter,conn"
		if after {
			want = "conn,waiter"
		}
		if got := w.events.String(); got != want {
			t.Fatalf("WaiterAfterConns %v: Close ran %s, want %s", after, got, want)
		}
		_, err = l.Acquire(ctx, "k", "o", time.Second)
		prefixed("acquire after Close", err)
		if !errors.Is(err, driver.ErrClosed) {
			t.Fatalf("acquire after Close: %v", err)
		}
		for what, err := range map[string]error{
			"refresh":   l.Refresh(ctx, "k", "o", time.Second),
			"release":   l.Release(ctx, "k", "o"),
			"ping":      l.Ping(ctx),
			"subscribe": func() error { _, _, err := l.Subscribe(ctx, "k"); return err }(),
			"watch":     func() error { _, err := l.WatchHold("k", "o", 1, func(error) {}); return err }(),
		} {
			prefixed(what+" after Close", err)
			if !errors.Is(err, driver.ErrClosed) {
				t.Fatalf("%s after Close: %v, want ErrClosed", what, err)
			}
		}
	}
}

// A Locker over one Conn runs a Node; Subscribe hands the waiter the lock
// key and channel, and a release wakes it.
func TestLockerNode(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, w := newTestLocker(t, LockerConfig{Name: "redis", Options: Options{Prefix: "p"}}, s.Addr)
	if l.node == nil || l.redlock != nil {
		t.Fatal("one Conn: want a Node")
	}
	if c := l.Capabilities(); c.MinTTL != MinTTL {
		t.Fatalf("MinTTL %v", c.MinTTL)
	}
	if err := l.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	tok, err := l.Acquire(ctx, "k", "a", 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, "k", "b", time.Second); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("contended acquire: %v", err)
	}
	if info, err := l.Inspect(ctx, "k"); err != nil || info.Owner != "a" || info.Token != tok {
		t.Fatalf("inspect: %+v, %v", info, err)
	}
	if err := l.Refresh(ctx, "k", "a", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	wake, stop, err := l.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	lock, _, channel := Keys("p", "k")
	w.mu.Lock()
	calls := w.calls
	w.mu.Unlock()
	if len(calls) != 1 || calls[0] != [2]string{lock, channel} {
		t.Fatalf("waiter got %v, want [[%s %s]]", calls, lock, channel)
	}
	if err := l.Release(ctx, "k", "a"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatal("no wake-up after the release")
	}
}

// A Locker over several Conns runs Redlock; its errors carry the name too.
func TestLockerRedlock(t *testing.T) {
	ms := redistest.StartN(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	o := Options{NodeTimeout: 200 * time.Millisecond}
	l, _ := newTestLocker(t, LockerConfig{Name: "rueidis", Options: o}, redistest.Addrs(ms)...)
	if l.redlock == nil || l.node != nil {
		t.Fatal("three Conns: want a Redlock")
	}
	if c := l.Capabilities(); c.MinTTL != 3*o.NodeTimeout {
		t.Fatalf("MinTTL %v, want 3 × node_timeout", c.MinTTL)
	}
	if _, err := l.Acquire(ctx, "k", "a", time.Second); err != nil {
		t.Fatal(err)
	}
	err := l.Release(ctx, "k", "b")
	if !errors.Is(err, driver.ErrNotHeld) || !strings.HasPrefix(err.Error(), "rueidis: redlock release: ") {
		t.Fatalf("release by another owner: %v", err)
	}
}

// With a HoldWatch, a deleted key is reported lost; the owner's own
// release is not.
func TestLockerHoldWatch(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reader := newTestConn(t, s.Addr).c
	hold := NewHoldWatch(func(ctx context.Context, lock string) (string, bool, error) {
		v, err := reader.Get(ctx, lock).Result()
		if errors.Is(err, redis.Nil) {
			return "", false, nil
		}
		return v, err == nil, err
	}, DefaultPrefix)
	l, _ := newTestLocker(t, LockerConfig{Name: "rueidis", Hold: hold}, s.Addr)
	lostc := make(chan error, 2)
	for _, key := range []string{"gone", "mine"} {
		tok, err := l.Acquire(ctx, key, "a", 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.WatchHold(key, "a", tok, func(err error) { lostc <- err }); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Release(ctx, "mine", "a"); err != nil {
		t.Fatal(err)
	}
	lock, _, _ := Keys(DefaultPrefix, "gone")
	if _, err := redistest.Do(s.Addr, "DEL", lock); err != nil {
		t.Fatal(err)
	}
	// Nothing invalidates here (no tracking): a Reset makes the watch
	// read the key again, as a driver does after a reconnect.
	hold.Reset()
	select {
	case err := <-lostc:
		if !errors.Is(err, driver.ErrNotHeld) || !strings.HasPrefix(err.Error(), `rueidis: lock "gone"`) {
			t.Fatalf("lost: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the deleted key was not reported lost")
	}
	select {
	case err := <-lostc:
		t.Fatalf("a second loss reported: %v", err)
	default:
	}
}

func TestCheckOptionsAndAdopted(t *testing.T) {
	o, err := CheckOptions("rueidis", Options{})
	if err != nil || o != (Options{}).WithDefaults() {
		t.Fatalf("zero Options: %+v, %v", o, err)
	}
	for name, o := range map[string]Options{
		"braces":   {Prefix: "a{b}"},
		"drift":    {DriftFactor: 0.5},
		"negative": {NodeTimeout: -1},
	} {
		_, err := CheckOptions("rueidis", o)
		if !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), "rueidis: ") || strings.Contains(err.Error(), " redis: ") {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := Adopted("rueidis", false, []any{1}, o); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("%s: Adopted: %v", name, err)
		}
	}
	var c any = 1
	for name, tc := range map[string]struct {
		redlock bool
		clients []any
		want    string
	}{
		"nil client":   {false, []any{nil}, "redis: nil client"},
		"one master":   {true, []any{c}, "redis: Redlock needs at least 2 clients, got 1"},
		"a nil master": {true, []any{c, nil}, "redis: client 1 is nil"},
	} {
		_, err := Adopted("redis", tc.redlock, tc.clients, Options{})
		if !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), tc.want) {
			t.Fatalf("%s: %v, want %q", name, err, tc.want)
		}
	}
	if _, err := Adopted("redis", true, []any{c, c}, Options{}); err != nil {
		t.Fatal(err)
	}
}

func doOn(c redis.UniversalClient) DoFunc {
	return func(ctx context.Context, args ...string) (any, error) {
		a := make([]any, len(args))
		for i, x := range args {
			a[i] = x
		}
		v, err := c.Do(ctx, a...).Result()
		return v, MarkUnavailable(err)
	}
}

func TestCheckMaster(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CheckMaster(ctx, "redis", master.Addr, false, doOn(newTestConn(t, master.Addr).c)); err != nil {
		t.Fatalf("master: %v", err)
	}
	err := CheckMaster(ctx, "rueidis", replica.Addr, false, doOn(newTestConn(t, replica.Addr).c))
	want := "rueidis: " + replica.Addr + " is a replica (ROLE slave of 127.0.0.1:" + strconv.Itoa(master.Port) + "), not a master"
	if !errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "allow_replica=true") {
		t.Fatalf("replica: %v, want %q…", err, want)
	}
	if err := CheckMaster(ctx, "redis", replica.Addr, true, doOn(newTestConn(t, replica.Addr).c)); err != nil {
		t.Fatalf("replica allowed: %v", err)
	}
	down := "127.0.0.1:" + strconv.Itoa(redistest.RefusedPort(t))
	explained := doOn(newTestConn(t, down).c).Explain(func(err error) error { return errors.Join(errors.New("explained"), err) })
	err = CheckMaster(ctx, "redis", down, false, explained)
	if !errors.Is(err, driver.ErrUnavailable) || !strings.HasPrefix(err.Error(), "redis: "+down+": ROLE: explained") {
		t.Fatalf("unreachable: %v", err)
	}
}

func TestCheckQuorum(t *testing.T) {
	down := MarkUnavailable(errors.New("connection refused"))
	replica := errors.Join(errors.New("replica"), driver.ErrInvalid)
	auth := errors.New("auth")
	isAuth := func(err error) bool { return errors.Is(err, auth) }
	for name, tc := range map[string]struct {
		errs []error
		want error // nil: success; else errors.Is
	}{
		"all up":          {[]error{nil, nil, nil}, nil},
		"a minority down": {[]error{nil, down, nil}, nil},
		"a majority down": {[]error{down, down, nil}, driver.ErrUnavailable},
		"a replica":       {[]error{nil, replica, nil}, driver.ErrInvalid},
		"an evicting one": {[]error{nil, nil, ErrEvictionPolicy}, ErrEvictionPolicy},
		"a fatal one":     {[]error{auth, nil, nil}, auth},
	} {
		err := CheckQuorum("rueidis", len(tc.errs), func(i int) error { return tc.errs[i] }, isAuth)
		switch {
		case tc.want == nil && err != nil, tc.want != nil && !errors.Is(err, tc.want):
			t.Fatalf("%s: %v, want %v", name, err, tc.want)
		case name == "a majority down" && !strings.HasPrefix(err.Error(), "rueidis: Redlock: 1 of 3 masters answered, quorum 2: "):
			t.Fatalf("%s: %v", name, err)
		}
	}
}
