package file

import (
	"os"
	"testing"
	"time"

	"github.com/go-locker/locker"
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
	tok, err := d.Acquire(ctx, "k", "A", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lost := make(chan error, 1)
	stop, err := d.WatchHold("k", "A", tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
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
