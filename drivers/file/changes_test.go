package file

import (
	"testing"
	"time"
)

// watchChanges starts l.WatchChanges on key for the test, reporting on the
// returned channel.
func watchChanges(t *testing.T, l *Locker, key string) <-chan struct{} {
	t.Helper()
	ch := make(chan struct{}, 1)
	stop, err := l.WatchChanges(ctxT(t), key, func() { signal(ch) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return ch
}

// TestWatchChanges: a Locker watching a key's changes hears each grant (a
// first one, which creates the lock file, and one after a release) and
// each release made through another Locker, and not another key's; with
// inotify and, when it is unavailable, by polling.
func TestWatchChanges(t *testing.T) {
	for _, polling := range []bool{false, true} {
		name := "inotify"
		if polling {
			name = "polling"
		}
		t.Run(name, func(t *testing.T) {
			noInotify = polling
			t.Cleanup(func() { noInotify = false })
			dir := t.TempDir()
			a, b := open(t, dir), open(t, dir)
			ctx := ctxT(t)
			ch := watchChanges(t, b, "k")
			if !polling {
				other := watchChanges(t, b, "other")
				if _, err := a.Acquire(ctx, "k", "A", time.Hour); err != nil {
					t.Fatal(err)
				}
				waitWake(t, ch, "first grant")
				noWake(t, other, "a grant of k")
			} else if _, err := a.Acquire(ctx, "k", "A", time.Hour); err != nil {
				t.Fatal(err)
			}
			if err := a.Release(ctx, "k", "A"); err != nil {
				t.Fatal(err)
			}
			waitWake(t, ch, "release")
			if _, err := a.Acquire(ctx, "k", "B", time.Hour); err != nil {
				t.Fatal(err)
			}
			waitWake(t, ch, "grant after a release")
		})
	}
}
