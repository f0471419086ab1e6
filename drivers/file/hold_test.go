package file

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// The lock file removed, or rewritten by another owner, closes the holder's
// Lost at once: measured under a millisecond, asserted within 2s (renewal,
// which would find the loss otherwise, runs every 20s here); the holder's
// own refreshes do not.
func TestHoldWatcherClosesLost(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, l *Locker)
	}{
		{"removed", func(t *testing.T, l *Locker) {
			if err := os.Remove(l.Path("k")); err != nil {
				t.Fatal(err)
			}
		}},
		{"rewritten", func(t *testing.T, l *Locker) {
			r := lease{token: 1, key: "k"}
			r.grant("someone else", now(l.boot), time.Hour)
			if err := os.WriteFile(l.Path("k"), r.encode(nil), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"taken after removal", func(t *testing.T, l *Locker) {
			if err := os.Remove(l.Path("k")); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Acquire(ctxT(t), "k", "B", time.Minute); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := open(t, t.TempDir())
			l := locker.New(d)
			defer l.Close()
			ctx := ctxT(t)
			lk, err := l.Acquire(ctx, "k", locker.WithTTL(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if err := lk.Refresh(ctx, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-lk.Lost():
				t.Fatal("Lost closed by the holder's own refreshes")
			case <-time.After(50 * time.Millisecond):
			}
			broken := time.Now()
			tc.break_(t, d)
			select {
			case <-lk.Lost():
				el := time.Since(broken)
				t.Logf("Lost %v after the lease was broken", el)
				if el > 100*time.Millisecond {
					t.Fatalf("Lost closed %v after the lease was broken, want within 100ms", el)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Lost still open 2s after the lease was broken")
			}
		})
	}
}

// The holder's own release is not a loss.
func TestHoldWatcherRelease(t *testing.T) {
	d := open(t, t.TempDir())
	ctx := ctxT(t)
	lost := acquireWatched(t, d, "k")
	if err := d.Release(ctx, "k", "A"); err != nil {
		t.Fatal(err)
	}
	// A marker event after the release: once the watch has seen it, it has
	// seen the release too.
	wake := subscribe(t, d, "marker")
	if _, err := d.Acquire(ctx, "marker", "A", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, "marker", "A"); err != nil {
		t.Fatal(err)
	}
	waitWake(t, wake, "the marker's release")
	select {
	case err := <-lost:
		t.Fatalf("the holder's own release reported as a loss: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
}

// A hold check that finds the lock file's flock held (a process stopped
// while it writes the file) gives up after holdCheckTimeout without a
// report, and the watch still reports a later loss; a check blocked on
// the flock ends at once when the watch stops.
func TestHoldCheckGivesUpOnHeldFlock(t *testing.T) {
	d := open(t, t.TempDir())
	ctx := ctxT(t)
	lost := acquireWatched(t, d, "k")

	unlock := holdFlock(t, d.Path("k"))
	began := time.Now()
	waitFlocksMove(t, "the check after the write under the flock")
	waitFlocksStill(t, 3*time.Second, "a check blocked on the flock")
	if gave := time.Since(began); gave < holdCheckTimeout/2 {
		t.Fatalf("the check gave up after %v, want about %v", gave, holdCheckTimeout)
	}
	select {
	case err := <-lost:
		t.Fatalf("a check that could not take the flock reported a loss: %v", err)
	default:
	}
	unlock()
	if err := os.Remove(d.Path("k")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("lost: %v, want ErrNotHeld", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the lock file's removal was not reported after a check gave up")
	}

	// A second watch, stopped while its check waits for the flock.
	tok, err := d.Acquire(ctx, "k2", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	stop2, err := d.WatchHold("k2", "A", tok, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	defer holdFlock(t, d.Path("k2"))()
	stop2()
	waitFlocksStill(t, holdCheckTimeout/2, "a check of a stopped watch")
}

// holdFlock takes an exclusive flock on path and writes the file's own
// content back (an event for its watchers); it returns the unlock.
func holdFlock(t *testing.T, path string) func() {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return func() { _ = f.Close() }
}

// waitFlocksStill waits, up to within, until no flock attempt has been
// made for 200ms (a backing-off check tries every 2ms at most).
func waitFlocksStill(t *testing.T, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	last, since := flocks.Load(), time.Now()
	for time.Since(since) < 200*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("%s still tries the flock %v later", what, within)
		}
		time.Sleep(10 * time.Millisecond) // polling a counter with a deadline
		if n := flocks.Load(); n != last {
			last, since = n, time.Now()
		}
	}
}

// waitFlocksMove waits, up to 2s, until a flock attempt is made.
func waitFlocksMove(t *testing.T, what string) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for n := flocks.Load(); flocks.Load() == n; {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not try the flock within 2s", what)
		}
		time.Sleep(time.Millisecond) // polling a counter with a deadline
	}
}

// acquireWatched takes key for owner "A" and watches the hold until the
// test ends; the returned channel receives the loss reported.
func acquireWatched(t *testing.T, d *Locker, key string) <-chan error {
	t.Helper()
	tok, err := d.Acquire(ctxT(t), key, "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	stop, err := d.WatchHold(key, "A", tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return lost
}
