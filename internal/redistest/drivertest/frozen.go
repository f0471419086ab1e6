package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// CallsBounded checks that l's calls without a deadline or a cancellation
// (context.Background) on a frozen server s each end with an error within
// bound: the client's own timeout, which the driver reports as
// rediscore.TimedConn. It takes a lock first, then freezes s until the test
// ends.
func CallsBounded(t *testing.T, l driver.Locker, s *redistest.Server, bound time.Duration) {
	ctx := context.Background()
	const owner = "owner-bounded"
	if _, err := l.Acquire(ctx, "k", owner, time.Minute); err != nil {
		t.Fatal(err)
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
