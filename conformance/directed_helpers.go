package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// cut cuts d off with the Harness's Cut; the heal it returns may be
// called more than once, and is called when the test ends.
func (s *suite) cut(t *testing.T, d driver.Locker) func() {
	t.Helper()
	heal, err := s.h.Cut(d)
	if err != nil {
		t.Fatalf("fault hook Cut failed: %v", err)
	}
	var once sync.Once
	h := func() { once.Do(heal) }
	t.Cleanup(h)
	return h
}

// heldAcross takes a fresh key through a fresh Locker d with a long TTL,
// checks Inspect through another, q, runs a restart hook, and returns what
// Inspect through q reports once the backend answers.
func (s *suite) heldAcross(t *testing.T, hook func(context.Context) error, name string) (d, q driver.Locker, key, owner string, g grant, info driver.Info, err error) {
	t.Helper()
	d, q = s.open(t), s.open(t)
	key, owner = newKey(t), newOwner()
	g = s.acquire(t, d, key, owner, s.hold())
	s.mustInspect(t, q, key, owner, g.token, "before the restart")
	s.restart(t, hook, name)
	info, err = s.inspectAnswer(t, q, key)
	return d, q, key, owner, g, info, err
}

// watched takes a fresh key through a fresh Locker d with a long TTL and
// watches the grant through d (see watch); q is another Locker.
func (s *suite) watched(t *testing.T) (d, q driver.Locker, key, owner string, g grant, lost <-chan error) {
	t.Helper()
	d, q = s.open(t), s.open(t)
	key, owner = newKey(t), newOwner()
	g = s.acquire(t, d, key, owner, s.hold())
	lost, stop := s.watch(t, d, key, owner, g.token)
	if stop != nil {
		t.Cleanup(stop)
	}
	return d, q, key, owner, g, lost
}

// watch starts a HoldWatcher watch of a grant; lost receives the error it
// reports. Where WatchHold refuses the grant, it returns a nil lost.
func (s *suite) watch(t *testing.T, d driver.Locker, key, owner string, token uint64) (<-chan error, func()) {
	t.Helper()
	lost := make(chan error, 1)
	stop, err := d.(driver.HoldWatcher).WatchHold(key, owner, token, func(err error) {
		select {
		case lost <- err:
		default:
		}
	})
	if err != nil {
		// As in Driver/HoldWatcher: a grant the driver cannot watch is not
		// watched, and there is nothing to check.
		t.Logf("WatchHold returned %v: the grant is not watched, so there is nothing to check", err)
		return nil, nil
	}
	return lost, stop
}

// restart runs a restart hook.
func (s *suite) restart(t *testing.T, hook func(context.Context) error, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := hook(ctx); err != nil {
		t.Fatalf("fault hook %s failed: %v", name, err)
	}
}

// mustInspect checks that Inspect through q reports owner and token.
func (s *suite) mustInspect(t *testing.T, q driver.Locker, key, owner string, token uint64, when string) {
	t.Helper()
	info, err := q.(driver.Inspector).Inspect(s.callCtx(t), key)
	if err != nil || info.Owner != owner || info.Token != token {
		t.Fatalf("Inspect %s: got %s, want owner %.8s token %d", when, fmtInfo(info, err), owner, token)
	}
}

// agrees checks that what Inspect reported (info, err) agrees with whether
// another owner can take key: a reported holder keeps it; a free key is
// free. It leaves the key held by nobody new.
func (s *suite) agrees(t *testing.T, q driver.Locker, key string, info driver.Info, err error, when string) {
	t.Helper()
	o := newOwner()
	aerr := s.answer(t, "Acquire by another owner "+when, func(ctx context.Context) error {
		_, err := q.Acquire(ctx, key, o, ttlFor(q, s.hold()))
		return err
	})
	if aerr == nil {
		_ = q.Release(s.callCtx(t), key, o)
	}
	switch {
	case err == nil && aerr == nil:
		t.Fatalf("Inspect %s reports %s, but another owner then took the key: a stale holder", when, fmtInfo(info, nil))
	case errors.Is(err, driver.ErrNotHeld) && errors.Is(aerr, driver.ErrNotAcquired):
		t.Fatalf("Inspect %s reports the key free, but another owner could not take it: %v", when, aerr)
	case aerr != nil && !errors.Is(aerr, driver.ErrNotAcquired):
		t.Fatalf("Acquire by another owner %s: %v", when, aerr)
	}
}

// inspectAnswer inspects key through q once the backend answers.
func (s *suite) inspectAnswer(t *testing.T, q driver.Locker, key string) (driver.Info, error) {
	t.Helper()
	var info driver.Info
	err := s.answer(t, "Inspect", func(ctx context.Context) error {
		var err error
		info, err = q.(driver.Inspector).Inspect(ctx, key)
		return err
	})
	if err != nil && !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return info, err
}

// recoverLimit bounds how long after a fault the backend may take to answer
// again.
const recoverLimit = 30 * time.Second

// answer calls fn until the backend answers rather than failing to be
// reached (see definitive), and returns its answer: the first calls after
// a fault may fail while the driver reconnects.
func (s *suite) answer(t *testing.T, what string, fn func(ctx context.Context) error) error {
	t.Helper()
	start := time.Now()
	deadline := start.Add(recoverLimit)
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), quick)
		err := fn(ctx)
		cancel()
		if definitive(err) {
			if n > 1 {
				t.Logf("%s: answered at attempt %d, %v after the first", what, n, fmtDur(time.Since(start)))
			}
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the backend did not answer within %v of the fault: %v", what, recoverLimit, err)
		}
		time.Sleep(max(s.unit/20, 5*time.Millisecond)) // retrying until the backend is back is the point
	}
}

// definitive reports whether err is the backend's answer, not a failure
// to reach it.
func definitive(err error) bool {
	return err == nil || errors.Is(err, driver.ErrNotHeld) || errors.Is(err, driver.ErrNotAcquired) ||
		errors.Is(err, driver.ErrInvalid) || errors.Is(err, driver.ErrClosed)
}

func fmtInfo(info driver.Info, err error) string {
	if err != nil {
		return fmt.Sprintf("error %v", err)
	}
	return fmt.Sprintf("owner %.8s token %d", info.Owner, info.Token)
}
