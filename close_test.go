package locker_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
	_ "github.com/go-locker/locker/drivers/redis"
	"github.com/go-locker/locker/internal/redistest"
)

// netMem is a mem Locker behind a simulated network: each call waits a
// random fraction of a millisecond before it reaches the store (the
// request) and after (the reply), and Close closes the connection, so a
// call in flight at that moment fails as a real client's does, with
// ErrUnavailable, whether or not the store already applied it.
type netMem struct {
	inner driver.Locker
	mu    sync.Mutex
	shut  bool
}

func newNetMem(st *mem.Store) *netMem { return &netMem{inner: st.Locker()} }

var errConnClosed = fmt.Errorf("netmem: %w: use of closed network connection", driver.ErrUnavailable)

// leg is one trip over the network.
func (n *netMem) leg(ctx context.Context) error {
	t := time.NewTimer(time.Duration(mrand.N(800)) * time.Microsecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.shut {
		return errConnClosed
	}
	return nil
}

// call runs fn between a request leg and a reply leg.
func (n *netMem) call(ctx context.Context, fn func() error) error {
	if err := n.leg(ctx); err != nil {
		return err
	}
	if err := fn(); err != nil {
		return err
	}
	return n.leg(ctx)
}

func (n *netMem) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (tok uint64, err error) {
	err = n.call(ctx, func() error { tok, err = n.inner.Acquire(ctx, key, owner, ttl); return err })
	return tok, err
}

func (n *netMem) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return n.call(ctx, func() error { return n.inner.Refresh(ctx, key, owner, ttl) })
}

func (n *netMem) Release(ctx context.Context, key, owner string) error {
	return n.call(ctx, func() error { return n.inner.Release(ctx, key, owner) })
}

func (n *netMem) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	return n.inner.(driver.Waiter).Subscribe(ctx, key)
}

func (n *netMem) Close() error {
	n.mu.Lock()
	n.shut = true
	n.mu.Unlock()
	return n.inner.Close()
}

// netMemBlocking waits in the "server", as a driver.BlockingAcquirer.
type netMemBlocking struct{ *netMem }

func (n netMemBlocking) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	wake, cancel, err := n.inner.(driver.Waiter).Subscribe(ctx, key)
	if err != nil {
		return 0, err
	}
	defer cancel()
	for {
		tok, err := n.Acquire(ctx, key, owner, ttl)
		if !errors.Is(err, driver.ErrNotAcquired) {
			return tok, err
		}
		select {
		case <-wake:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// raceBackend is where the Close races run: open returns a fresh Locker
// (a separate connection), free reports whether key is held by nobody, as
// another client reading the server sees it.
type raceBackend struct {
	name string
	open func(t *testing.T) *locker.Locker
	free func(t *testing.T, key string) error
	// rounds per call raced; spread is how long after the call Close
	// starts, at most.
	rounds int
	spread time.Duration
}

// memFree reports whether key is free in st.
func memFree(st *mem.Store) func(t *testing.T, key string) error {
	return func(t *testing.T, key string) error {
		in, err := st.Locker().(driver.Inspector).Inspect(context.Background(), key)
		if errors.Is(err, driver.ErrNotHeld) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("held by %q, token %d, %v left", in.Owner, in.Token, in.Remaining)
	}
}

func memBackends() []raceBackend {
	st := mem.NewStore()
	free := memFree(st)
	return []raceBackend{
		{name: "mem", rounds: 300, spread: 3 * time.Millisecond, free: free,
			open: func(*testing.T) *locker.Locker { return locker.New(newNetMem(st)) }},
		{name: "mem-blocking", rounds: 300, spread: 3 * time.Millisecond, free: free,
			open: func(*testing.T) *locker.Locker { return locker.New(netMemBlocking{newNetMem(st)}) }},
	}
}

// redisBackends are a private Redis server, with its fair queue and
// without.
func redisBackends(t *testing.T) []raceBackend {
	s := redistest.Start(t)
	var bs []raceBackend
	for _, params := range []string{"", "?fair=false"} {
		url := s.URL() + params
		checker, err := locker.OpenURL(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { checker.Close() })
		bs = append(bs, raceBackend{
			name: "redis" + strings.ReplaceAll(params, "?", "-"), rounds: 200, spread: 2 * time.Millisecond,
			open: func(t *testing.T) *locker.Locker {
				l, err := locker.OpenURL(url)
				if err != nil {
					t.Fatal(err)
				}
				return l
			},
			free: func(t *testing.T, key string) error {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				in, err := checker.Inspect(ctx, key)
				if errors.Is(err, locker.ErrNotHeld) {
					return nil
				}
				if err != nil {
					return err
				}
				return fmt.Errorf("held by %q, token %d, %v left", in.Owner, in.Token, in.Remaining)
			},
		})
	}
	return bs
}

// closeRace is one call raced against Close. prepare readies it on l (a
// Locker of its own); other is a second Locker on the same backend, for a
// holder to wait behind. The call returns the lock it won, if any, and its
// error.
type closeRace struct {
	name    string
	prepare func(ctx context.Context, l, other *locker.Locker, key string) (func() (*locker.Lock, error), error)
}

var closeRaces = []closeRace{
	{"Release", func(ctx context.Context, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			return nil, err
		}
		return func() (*locker.Lock, error) { return nil, lk.Release(ctx) }, nil
	}},
	{"Acquire", func(ctx context.Context, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) { return l.Acquire(ctx, key, locker.WithTTL(time.Minute)) }, nil
	}},
	{"TryAcquire", func(ctx context.Context, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) { return l.TryAcquire(ctx, key, locker.WithTTL(time.Minute)) }, nil
	}},
	{"Do", func(ctx context.Context, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) {
			return nil, l.Do(ctx, key, func(ctx context.Context) error {
				select { // a short job, which Close may cut short
				case <-time.After(time.Duration(mrand.N(1000)) * time.Microsecond):
				case <-ctx.Done():
				}
				return nil
			}, locker.WithTTL(time.Minute))
		}, nil
	}},
	{"QueuedAcquire", func(ctx context.Context, l, other *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		holder, err := other.TryAcquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			return nil, err
		}
		type res struct {
			lk  *locker.Lock
			err error
		}
		got := make(chan res, 1)
		go func() {
			lk, err := l.Acquire(ctx, key, locker.WithTTL(time.Minute))
			got <- res{lk, err}
		}()
		// The holder lets go about when Close starts: the waiter may be
		// granted the key just before, during or after it.
		return func() (*locker.Lock, error) {
			time.Sleep(time.Duration(mrand.N(2000)) * time.Microsecond)
			if err := holder.Release(ctx); err != nil {
				return nil, fmt.Errorf("holder's Release: %w", err)
			}
			r := <-got
			return r.lk, r.err
		}, nil
	}},
}

// checkRaced checks, after Close returned, the outcome of a call that raced
// it: it finished (nil), or it was cut short or refused and then says
// ErrClosed, never ErrUnavailable (a connection closed under it); a lock it
// won is one Close released (its Lost closed, its Err matching ErrClosed).
func checkRaced(lk *locker.Lock, err error) error {
	if err != nil {
		if errors.Is(err, locker.ErrClosed) && !errors.Is(err, locker.ErrUnavailable) {
			return nil
		}
		return fmt.Errorf("the call racing Close returned %w; want nil or an error matching ErrClosed and not ErrUnavailable", err)
	}
	if lk == nil {
		return nil
	}
	select {
	case <-lk.Lost():
	default:
		return fmt.Errorf("a lock granted before Close returned is still held after it")
	}
	if !errors.Is(lk.Err(), locker.ErrClosed) || !errors.Is(lk.Err(), locker.CauseClosed) {
		return fmt.Errorf("a lock released by Close: Err() = %v, want CauseClosed and ErrClosed", lk.Err())
	}
	return nil
}

// Close is a barrier: it races Release, Acquire, TryAcquire, Do and a
// queued Acquire, a few hundred rounds each, on mem behind a simulated
// network (with a Waiter, and blocking in the "server") and on a real
// Redis server (fair queue and fair=false). Every call that raced it
// returns nil or an error matching ErrClosed (never ErrUnavailable), and
// the moment Close returns nothing of its Locker's is held on the server:
// a release in flight was waited for, and a grant won during Close was
// released.
func TestCloseIsABarrier(t *testing.T) {
	backends := append(memBackends(), redisBackends(t)...)
	for _, b := range backends {
		for _, r := range closeRaces {
			t.Run(b.name+"/"+r.name, func(t *testing.T) { raceClose(t, b, r) })
		}
	}
}

func raceClose(t *testing.T, b raceBackend, r closeRace) {
	other := b.open(t)
	defer other.Close()
	ctx := ctxT(t, 2*time.Minute)
	prefix := fmt.Sprintf("close-race/%s/%d/", t.Name(), time.Now().UnixNano())
	failures := 0
	for i := range b.rounds {
		key := fmt.Sprintf("%s%d", prefix, i)
		l := b.open(t)
		call, err := r.prepare(ctx, l, other, key)
		if err != nil {
			t.Fatalf("round %d: prepare: %v", i, err)
		}
		type result struct {
			lk  *locker.Lock
			err error
		}
		res := make(chan result, 1)
		go func() {
			lk, err := call()
			res <- result{lk, err}
		}()
		time.Sleep(time.Duration(mrand.N(int64(b.spread))))
		if err := l.Close(); err != nil && !errors.Is(err, locker.ErrClosed) {
			t.Errorf("round %d: Close: %v", i, err)
		}
		// At once: Close has waited for what was in flight. The queued
		// race's holder may still hold the key until its call returns.
		if r.name != "QueuedAcquire" {
			if err := b.free(t, key); err != nil {
				failures++
				t.Errorf("round %d: the moment Close returned, %q was not free: %v", i, key, err)
			}
		}
		select {
		case got := <-res:
			if err := checkRaced(got.lk, got.err); err != nil {
				failures++
				t.Errorf("round %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: the call did not return within 30s of Close", i)
		}
		if r.name == "QueuedAcquire" {
			if err := b.free(t, key); err != nil {
				failures++
				t.Errorf("round %d: after Close and the holder's release, %q was not free: %v", i, key, err)
			}
		}
		if failures > 10 {
			t.Fatalf("stopping after %d failures in %d rounds", failures, i+1)
		}
	}
}

// Close from several goroutines at once: every call returns only once the
// Locker's locks are released and its driver closed, and the later ones
// return nil.
func TestConcurrentClose(t *testing.T) {
	st := mem.NewStore()
	free := memFree(st)
	ctx := ctxT(t, 30*time.Second)
	for round := range 50 {
		l := locker.New(newNetMem(st))
		key := fmt.Sprintf("concurrent-close/%d", round)
		if _, err := l.TryAcquire(ctx, key); err != nil {
			t.Fatal(err)
		}
		const closers = 4
		errs := make(chan error, closers)
		for range closers {
			go func() {
				if err := l.Close(); err != nil {
					errs <- fmt.Errorf("Close: %w", err)
					return
				}
				errs <- free(t, key)
			}()
		}
		for range closers {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
}
