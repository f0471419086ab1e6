package conformance

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// closeRaceRounds is how many times Locker/CloseRaces races each call
// against Close: enough to land Close before, during and after the call's
// round trip on a local server, and few enough to take seconds.
const closeRaceRounds = 20

// closeRaceCall is one call raced against Close: prepare readies it on l,
// with other (another Locker on the backend) for a holder to wait behind,
// and returns the call, which returns the lock it won, if any, and its
// error.
type closeRaceCall struct {
	name    string
	prepare func(ctx context.Context, s *suite, l, other *locker.Locker, key string) (func() (*locker.Lock, error), error)
}

var closeRaceCalls = []closeRaceCall{
	{"Release", func(ctx context.Context, s *suite, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(s.hold()))
		if err != nil {
			return nil, err
		}
		return func() (*locker.Lock, error) { return nil, lk.Release(ctx) }, nil
	}},
	{"Acquire", func(ctx context.Context, s *suite, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) { return l.Acquire(ctx, key, locker.WithTTL(s.hold())) }, nil
	}},
	{"TryAcquire", func(ctx context.Context, s *suite, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) { return l.TryAcquire(ctx, key, locker.WithTTL(s.hold())) }, nil
	}},
	{"Do", func(ctx context.Context, s *suite, l, _ *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		return func() (*locker.Lock, error) {
			return nil, l.Do(ctx, key, func(ctx context.Context) error {
				select {
				case <-time.After(time.Duration(mrand.N(2000)) * time.Microsecond):
				case <-ctx.Done():
				}
				return nil
			}, locker.WithTTL(s.hold()))
		}, nil
	}},
	{"QueuedAcquire", func(ctx context.Context, s *suite, l, other *locker.Locker, key string) (func() (*locker.Lock, error), error) {
		holder, err := other.TryAcquire(ctx, key, locker.WithTTL(s.hold()))
		if err != nil {
			return nil, err
		}
		type res struct {
			lk  *locker.Lock
			err error
		}
		got := make(chan res, 1)
		go func() {
			lk, err := l.Acquire(ctx, key, locker.WithTTL(s.hold()))
			got <- res{lk, err}
		}()
		return func() (*locker.Lock, error) {
			// The holder lets go about when Close starts: the waiter may
			// be granted the key before, during or after it.
			time.Sleep(time.Duration(mrand.N(4000)) * time.Microsecond)
			if err := holder.Release(ctx); err != nil {
				return nil, fmt.Errorf("the holder's Release: %w", err)
			}
			r := <-got
			return r.lk, r.err
		}, nil
	}},
}

// Close racing Release, Acquire, TryAcquire, Do and an Acquire queued
// behind another holder, closeRaceRounds times each, with Close started at
// a random moment of the call. Each call returns nil, or an error matching
// ErrClosed and not ErrUnavailable; a lock it won is released by Close
// (Lost closed, Err matching ErrClosed); and nothing is held on the server
// afterwards: the moment Close returns (except for the queued race's other
// holder), after the holder let go, and once more after a pause in which a
// waiter left queued in the server would have taken its key.
func (s *suite) lockerCloseRaces(t *testing.T) {
	other := s.locker(t)
	probe := s.open(t)
	ctx := ctxT(t, 60*time.Second+40*s.unit)
	var keys []string
	for _, c := range closeRaceCalls {
		for i := range closeRaceRounds {
			key := newKey(t) + "/" + c.name
			keys = append(keys, key)
			if err := s.closeRace(ctx, c, other, probe, key); err != nil {
				t.Fatalf("%s, round %d: %v", c.name, i, err)
			}
		}
	}
	time.Sleep(wakeBound / 4)
	for _, key := range keys {
		if err := s.free(ctx, probe, key); err != nil {
			t.Fatalf("after every race: %v", err)
		}
	}
}

// closeRace runs one round of c against Close on a fresh Locker.
func (s *suite) closeRace(ctx context.Context, c closeRaceCall, other *locker.Locker, probe driver.Locker, key string) error {
	d, err := s.h.Open(ctx)
	if err != nil {
		return fmt.Errorf("Harness.Open: %w", err)
	}
	l := locker.New(d)
	defer l.Close()
	call, err := c.prepare(ctx, s, l, other, key)
	if err != nil {
		return fmt.Errorf("before the race: %w", err)
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
	time.Sleep(time.Duration(mrand.N(4000)) * time.Microsecond)
	if err := l.Close(); err != nil {
		return fmt.Errorf("Close: %w", err)
	}
	if c.name != "QueuedAcquire" {
		if err := s.free(ctx, probe, key); err != nil {
			return fmt.Errorf("the moment Close returned: %w", err)
		}
	}
	var r result
	select {
	case r = <-res:
	case <-time.After(quick + 5*time.Second):
		return fmt.Errorf("the call racing Close did not return within %v of it", quick+5*time.Second)
	}
	if err := checkClosedCall(r.lk, r.err); err != nil {
		return err
	}
	if c.name == "QueuedAcquire" {
		if err := s.free(ctx, probe, key); err != nil {
			return fmt.Errorf("after Close and the holder's release: %w", err)
		}
	}
	return nil
}

// checkClosedCall checks the outcome of a call that raced Close, once
// Close has returned.
func checkClosedCall(lk *locker.Lock, err error) error {
	if err != nil {
		if errors.Is(err, locker.ErrClosed) && !errors.Is(err, locker.ErrUnavailable) {
			return nil
		}
		return fmt.Errorf("the call racing Close returned %w; want nil, or an error matching locker.ErrClosed and not locker.ErrUnavailable", err)
	}
	if lk == nil {
		return nil
	}
	select {
	case <-lk.Lost():
	default:
		return errors.New("a lock won before Close returned is still held after it (its Lost is open)")
	}
	if !errors.Is(lk.Err(), locker.ErrClosed) || !errors.Is(lk.Err(), locker.CauseClosed) {
		return fmt.Errorf("a lock Close released: Err() = %v, want one matching CauseClosed and ErrClosed", lk.Err())
	}
	return nil
}

// free checks that nobody holds key: Inspect says so where the driver has
// an Inspector; otherwise another owner takes it at once (and lets go).
func (s *suite) free(ctx context.Context, probe driver.Locker, key string) error {
	if in, ok := probe.(driver.Inspector); ok {
		info, err := in.Inspect(ctx, key)
		if errors.Is(err, driver.ErrNotHeld) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("Inspect(%q): %w", key, err)
		}
		return fmt.Errorf("%q is held by %q (token %d, %v left)", key, info.Owner, info.Token, info.Remaining)
	}
	o := newOwner()
	if _, err := probe.Acquire(ctx, key, o, ttlFor(probe, s.hold())); err != nil {
		return fmt.Errorf("another owner's Acquire of %q: %w", key, err)
	}
	return probe.Release(ctx, key, o)
}

// WithMaxHold counts from the grant, after a wait longer than a second
// (and than the bound): Lost closes no earlier than the bound after the
// holder's release was sent (the earliest the waiter's grant can have
// been), and no later than the bound after Acquire returned; Lock.Granted
// lies between the two. The TTL is long enough that no refresh follows
// the wait.
func (s *suite) lockerMaxHoldFromGrant(t *testing.T) {
	holder, waiter := s.locker(t), s.locker(t)
	key := newKey(t)
	ctx := s.callCtx(t)
	wait := 1200 * time.Millisecond
	maxHold := time.Second
	hl, err := holder.Acquire(ctx, key, locker.WithTTL(s.hold()))
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	sent := make(chan time.Time, 1)
	relErr := make(chan error, 1)
	time.AfterFunc(wait, func() {
		sent <- time.Now()
		relErr <- hl.Release(context.Background())
	})
	lk, err := waiter.Acquire(ctx, key, locker.WithTTL(s.hold()), locker.WithMaxHold(maxHold))
	returned := time.Now()
	if err != nil {
		t.Fatalf("waiting Acquire with WithMaxHold: %v", err)
	}
	released := <-sent
	if err := <-relErr; err != nil {
		t.Fatalf("the holder's Release: %v", err)
	}
	if g := lk.Granted(); g.Before(released) || g.After(returned) {
		t.Errorf("Granted() is %v after the holder's release was sent; want between it and Acquire's return (%v)",
			g.Sub(released), returned.Sub(released))
	}
	select {
	case <-lk.Lost():
		t.Fatalf("Lost closed as Acquire returned (%v): the max hold counted the wait", lk.Err())
	default:
	}
	select {
	case <-lk.Lost():
	case <-time.After(maxHold + wakeBound):
		t.Fatalf("Lost not closed %v after Acquire returned, with WithMaxHold(%v)", time.Since(returned), maxHold)
	}
	lost := time.Now()
	wantErr(t, "Err() at the max hold", lk.Err(), locker.CauseMaxHold)
	if d := lost.Sub(released); d < maxHold {
		t.Fatalf("Lost closed %v after the holder's release was sent: before the max hold %v counted from any possible grant", d, maxHold)
	}
	t.Logf("waited %v; Lost closed %v after Acquire returned (max hold %v)", returned.Sub(released)+wait, lost.Sub(returned), maxHold)
}
