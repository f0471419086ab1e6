package rueidis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

var ownerSeq atomic.Int64

func newOwner() string { return fmt.Sprintf("owner-%d-%d", time.Now().UnixNano(), ownerSeq.Add(1)) }

// openT opens a Locker on dsn and closes it at cleanup.
func openT(t testing.TB, dsn string) *Locker {
	t.Helper()
	l, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func urlOf(addrs ...string) string { return Scheme + "://" + strings.Join(addrs, ",") }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestBasics(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	oa, ob := newOwner(), newOwner()
	tok, err := a.Acquire(ctx, "k", oa, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tok2, err := a.Acquire(ctx, "k", oa, 10*time.Second)
	if err != nil || tok2 != tok {
		t.Fatalf("idempotent acquire: %d, %v; want %d", tok2, err, tok)
	}
	_, err = b.Acquire(ctx, "k", ob, time.Second)
	var he *driver.HeldError
	if !errors.As(err, &he) || he.Remaining <= 0 || he.Remaining > 10*time.Second {
		t.Fatalf("contended acquire: %v", err)
	}
	if err := b.Release(ctx, "k", ob); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by non-owner: %v", err)
	}
	if err := b.Refresh(ctx, "k", ob, time.Second); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh by non-owner: %v", err)
	}
	in, err := b.Inspect(ctx, "k")
	if err != nil || in.Owner != oa || in.Token != tok {
		t.Fatalf("inspect: %+v %v", in, err)
	}

	wake, cancel, err := b.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := a.Release(ctx, "k", oa); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatal("no wake-up after release")
	}
	tok3, err := b.Acquire(ctx, "k", ob, time.Second)
	if err != nil || tok3 <= tok {
		t.Fatalf("acquire after release: %d %v (previous token %d)", tok3, err, tok)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "k", oa, time.Second); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
	if _, _, err := a.Subscribe(ctx, "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("subscribe after close: %v", err)
	}
}

func itoa(n int) string { return fmt.Sprint(n) }

// New, NewRedlock and NewWithClientOption with nil Options take every
// default, on working servers.
func TestNewDefaults(t *testing.T) {
	ctx := context.Background()
	ms := redistest.StartN(t, 2)
	var cls []rueidis.Client
	for _, m := range ms {
		cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr}, ForceSingleClient: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		cls = append(cls, cl)
	}
	l, err := New(ctx, cls[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Acquire(ctx, "k", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if v, _ := ms[0].Do("EXISTS", "locker:{k}"); v != int64(1) {
		t.Fatalf("nil Options: the lock is not under the default prefix (EXISTS = %v)", v)
	}
	rl, err := NewRedlock(ctx, cls, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	if got := rl.Capabilities().MinTTL; got != 300*time.Millisecond {
		t.Fatalf("NewRedlock with nil Options: MinTTL %v, want 3 × the default node timeout", got)
	}
	cl, err := NewWithClientOption(ctx, rueidis.ClientOption{InitAddress: []string{ms[1].Addr}, ForceSingleClient: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tok, err := cl.Acquire(ctx, "k", "o", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := cl.WatchHold("k", "o", tok, func(error) {})
	if err != nil {
		t.Fatalf("WatchHold on a Locker from NewWithClientOption: %v", err)
	}
	stop()
}

// Open and NewWithClientOption are bounded by ctx: a done ctx fails before
// any I/O, and a deadline cuts short the connection to servers that accept
// connections but do not answer (stopped), long before dial_timeout.
func TestOpenContext(t *testing.T) {
	s := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, urlOf(s.Addr)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Open with a cancelled ctx: %v", err)
	}
	if _, err := Open(ctx, urlOf(s.Addr)+"?bogus=1"); !errors.Is(err, driver.ErrInvalid) ||
		!strings.Contains(err.Error(), "unknown query parameter(s) bogus") {
		t.Fatalf("Open of a bad URL with a cancelled ctx: %v", err)
	}
	if _, err := NewWithClientOption(ctx, rueidis.ClientOption{InitAddress: []string{s.Addr}}, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("NewWithClientOption with a cancelled ctx: %v", err)
	}
	s2 := redistest.Start(t)
	for _, x := range []*redistest.Server{s, s2} {
		x.Stop()
		t.Cleanup(x.Cont)
	}
	// One server, and a Redlock of which only one master of three answers.
	for _, dsn := range []string{urlOf(s.Addr), urlOf(s.Addr, s2.Addr, redistest.Start(t).Addr)} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		start := time.Now()
		l, err := Open(ctx, dsn+"?dial_timeout=20s")
		cancel()
		if err == nil {
			l.Close()
			t.Fatalf("%s: Open succeeded on a stopped server", dsn)
		}
		if d := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || d > 5*time.Second {
			t.Fatalf("%s: Open = %v after %v; want context.DeadlineExceeded soon after 300ms", dsn, err, d)
		}
	}
}

// A call stuck on a frozen server returns as soon as its context is
// cancelled, whether the context has a deadline or not, on a Locker whose
// connection has carried only a call on context.Background and on one whose
// connection has also carried a call with a deadline.
func TestCancelOnFrozenServer(t *testing.T) {
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			s := redistest.Start(t)
			l := openT(t, urlOf(s.Addr))
			owner := newOwner()
			if _, err := l.Acquire(context.Background(), "k", owner, time.Minute); err != nil {
				t.Fatal(err)
			}
			if warm {
				if _, err := l.Inspect(ctxT(t, 10*time.Second), "k"); err != nil {
					t.Fatal(err)
				}
			}
			s.Stop()
			t.Cleanup(s.Cont)
			calls := map[string]func(context.Context) error{
				"refresh": func(ctx context.Context) error { return l.Refresh(ctx, "k", owner, time.Minute) },
				"release": func(ctx context.Context) error { return l.Release(ctx, "k", owner) },
				"inspect": func(ctx context.Context) error { _, err := l.Inspect(ctx, "k"); return err },
				"acquire": func(ctx context.Context) error { _, err := l.Acquire(ctx, "k2", owner, time.Minute); return err },
			}
			for name, call := range calls {
				for _, deadline := range []bool{false, true} {
					ctx, cancel := context.WithCancel(context.Background())
					if deadline {
						ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
					}
					errc := make(chan error, 1)
					go func() { errc <- call(ctx) }()
					time.Sleep(50 * time.Millisecond) // let the call reach the socket; the assertion below does not depend on it
					start := time.Now()
					cancel()
					select {
					case err := <-errc:
						if !errors.Is(err, context.Canceled) {
							t.Errorf("%s (deadline %v) cut short: %v", name, deadline, err)
						}
					case <-time.After(5 * time.Second):
						t.Fatalf("%s (deadline %v) did not return within 5s of its cancellation", name, deadline)
					}
					if d := time.Since(start); d > time.Second {
						t.Errorf("%s (deadline %v) returned %v after its cancellation", name, deadline, d)
					}
				}
			}
		})
	}
}

// Calls without a deadline or a cancellation on a frozen server end within
// the client's ConnWriteTimeout (10s by default), with an error: the bound
// the driver reports as rediscore.TimedConn, on which an acquire that
// outlives its caller relies instead of a deadline of its own.
func TestCallsBoundedOnFrozenServer(t *testing.T) {
	for _, c := range []struct {
		write time.Duration
		want  bool
	}{{0, true}, {time.Second, true}, {-1, false}} { // 0: rueidis's default, 10s; negative: none
		if got := timedOption(rueidis.ClientOption{ConnWriteTimeout: c.write}); got != c.want {
			t.Errorf("ConnWriteTimeout %v: timed = %v, want %v", c.write, got, c.want)
		}
	}
	s := redistest.Start(t)
	drivertest.CallsBounded(t, openT(t, urlOf(s.Addr)), s, 10*time.Second+3*time.Second) // ConnWriteTimeout, and its background PING's gap
}
