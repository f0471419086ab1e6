package rueidis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// Redlock over five masters keeps working with two of them killed and fails
// safely, with a clear error and no grant, with three killed.
func TestRedlockMinorityAndMajorityDown(t *testing.T) {
	ms := redistest.StartN(t, 5)
	addrs := redistest.Addrs(ms)
	d := openT(t, urlOf(addrs...))
	l := locker.New(d)
	ctx := ctxT(t, 60*time.Second)

	held, err := l.TryAcquire(ctx, "rl", locker.WithTTL(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ms[0].Kill()
	ms[1].Kill()
	// The held lock keeps renewing on the remaining quorum of three.
	if err := held.Refresh(ctx, 2*time.Second); err != nil {
		t.Fatalf("refresh with 2 of 5 down: %v", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release with 2 of 5 down: %v", err)
	}
	lk, err := l.TryAcquire(ctx, "rl", locker.WithTTL(2*time.Second))
	if err != nil {
		t.Fatalf("acquire with 2 of 5 down: %v", err)
	}
	if lk.Token() <= held.Token() {
		t.Fatalf("token %d <= previous %d", lk.Token(), held.Token())
	}
	// A contender is refused.
	if _, err := d.Acquire(ctx, "rl", newOwner(), time.Second); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("contending acquire with 2 of 5 down: %v, want ErrNotAcquired", err)
	}

	ms[2].Kill()
	select {
	case <-lk.Lost():
	case <-time.After(20 * time.Second):
		t.Fatal("Lost did not fire with 3 of 5 masters down")
	}
	_, err = d.Acquire(ctx, "rl2", newOwner(), time.Second)
	if err == nil {
		t.Fatal("acquire granted with 3 of 5 masters down")
	}
	if errors.Is(err, driver.ErrNotAcquired) || !strings.Contains(err.Error(), "quorum") {
		t.Fatalf("acquire with 3 of 5 down: %v, want an error naming the missing quorum", err)
	}
	t.Logf("acquire with 3 of 5 down: %v", err)
	// Nothing was left on the surviving nodes.
	lock, _, _ := keysOf(d, "rl2")
	for _, m := range ms[3:] {
		if v, err := m.Do("EXISTS", lock); err != nil || v != int64(0) {
			t.Fatalf("%s: EXISTS %s = %v, %v after a failed acquire", m.Addr, lock, v, err)
		}
	}
}

// A Redlock URL opens with a minority of masters down, redials them when
// they come back, and refuses to open without a quorum.
func TestRedlockOpenWithMastersDown(t *testing.T) {
	ms := redistest.StartN(t, 5)
	addrs := redistest.Addrs(ms)
	ms[0].Kill()
	ms[1].Kill()
	d := openT(t, urlOf(addrs...)+"?dial_timeout=1s")
	ctx := ctxT(t, 60*time.Second)
	o := newOwner()
	tok, err := d.Acquire(ctx, "down", o, 5*time.Second)
	if err != nil {
		t.Fatalf("acquire with 2 of 5 down at Open: %v", err)
	}
	// Bring the two back: they are redialled and get used again.
	ms[0].Restart()
	ms[1].Restart()
	lock, _, _ := keysOf(d, "down")
	drivertest.WaitFor(t, 30*time.Second, "the restarted masters to take part", func() bool {
		// Re-acquire (idempotent) until both restarted masters hold the key.
		c, err := d.Acquire(ctx, "down", o, 5*time.Second)
		if err != nil || c < tok {
			return false
		}
		for _, m := range ms[:2] {
			if v, err := m.Do("EXISTS", lock); err != nil || v != int64(1) {
				return false
			}
		}
		return true
	})
	if err := d.Release(ctx, "down", o); err != nil {
		t.Fatal(err)
	}

	ms[2].Kill()
	ms[3].Kill()
	ms[4].Kill()
	_, err = Open(context.Background(), urlOf(addrs...)+"?dial_timeout=1s")
	if err == nil || !strings.Contains(err.Error(), "quorum 3") {
		t.Fatalf("Open with 3 of 5 masters down: %v, want a quorum error", err)
	}
	t.Log(err)
}

// A wrong password on any master fails Open: retrying will not cure it.
func TestRedlockOpenAuthFailure(t *testing.T) {
	ms := redistest.StartN(t, 3)
	if _, err := ms[1].Do("CONFIG", "SET", "requirepass", "secret"); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), urlOf(ms[0].Addr, ms[1].Addr, ms[2].Addr))
	if err == nil || !errors.Is(err, errAuth) {
		t.Fatalf("Open: %v, want an authentication error", err)
	}
}
