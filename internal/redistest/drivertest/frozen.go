package drivertest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// CallsBounded checks that l's calls without a deadline or a cancellation
// (context.Background) on a frozen server s each end with an error within
// bound: the client's own timeout, which the driver reports as
// rediscore.TimedConn. It takes a lock first, watches it when l is a
// driver.HoldWatcher (as package locker does), then freezes s until the
// test ends.
func CallsBounded(t *testing.T, l driver.Locker, s *redistest.Server, bound time.Duration) {
	ctx := context.Background()
	const owner = "owner-bounded"
	tok, err := l.Acquire(ctx, "k", owner, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := l.(driver.HoldWatcher); ok {
		// Watched, so that the refresh takes the path of a held Lock (on
		// the Redis drivers, the hold watch's tracking connection).
		stop, err := w.WatchHold("k", owner, tok, func(error) {})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		WaitWatched(t, s.Do, "k")
	}
	s.Stop()
	t.Cleanup(s.Cont)
	in := l.(driver.Inspector)
	calls := map[string]func() error{
		"refresh": func() error { return l.Refresh(ctx, "k", owner, time.Minute) },
		"release": func() error { return l.Release(ctx, "k", owner) },
		"inspect": func() error { _, err := in.Inspect(ctx, "k"); return err },
		"acquire": func() error { _, err := l.Acquire(ctx, "k2", owner, time.Minute); return err },
	}
	type result struct {
		name string
		err  error
		took time.Duration
	}
	results := make(chan result, len(calls))
	start := time.Now()
	for name, call := range calls {
		go func() {
			err := call()
			results <- result{name, err, time.Since(start)}
		}()
	}
	deadline := time.After(bound)
	for range calls {
		select {
		case r := <-results:
			t.Logf("%s returned after %v: %v", r.name, r.took.Round(time.Millisecond), r.err)
			if r.err == nil {
				t.Errorf("%s succeeded on a frozen server", r.name)
			}
		case <-deadline:
			t.Fatalf("a call on a frozen server did not return within %v", bound)
		}
	}
}

// WaitWatched waits until the server tracks key for some client (CLIENT
// TRACKINGINFO does not name keys, so it probes: the key is tracked once
// a tracking client has read it). It reads the server's
// tracking_total_keys from INFO until it is positive.
func WaitWatched(t testing.TB, do func(args ...string) (any, error), key string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		v, err := do("INFO", "stats")
		if err == nil {
			if s, _ := v.(string); InfoInt(s, "tracking_total_keys:") > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server tracks no key 5s after the grant of %s", key)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition with a deadline
	}
}

// InfoInt returns the integer after name (e.g. "tracking_total_keys:") in
// an INFO reply, or 0.
func InfoInt(info, name string) int {
	_, rest, ok := strings.Cut(info, name)
	if !ok {
		return 0
	}
	k := 0
	for k < len(rest) && rest[k] >= '0' && rest[k] <= '9' {
		k++
	}
	n, _ := strconv.Atoi(rest[:k])
	return n
}
