package postgres

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/pgtest"
)

// With the server down, every call fails with ErrUnavailable, never
// ErrNotAcquired: Open, OpenURL, and Acquire, AcquireWait, Inspect and Ping
// on a Locker opened while the server was up (its pooled connection is
// found dead, and a fresh one is refused).
func TestUnavailableServerDown(t *testing.T) {
	srv := pgtest.Start(t)
	url := srv.URL()
	d := openT(t, url)
	l, err := locker.OpenURL(url)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := ctxFor(t, time.Minute)
	if _, err := l.TryAcquire(ctx, "warm", locker.WithTTL(time.Minute)); err != nil {
		t.Fatal(err) // leaves a pooled connection behind (released below)
	}
	srv.Kill(t)

	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, driver.ErrUnavailable) || errors.Is(err, driver.ErrNotAcquired) {
			t.Errorf("%s with the server down: %v, want ErrUnavailable and not ErrNotAcquired", what, err)
		}
	}
	_, err = Open(ctx, url)
	check("Open", err)
	_, err = locker.OpenURL(url)
	check("locker.OpenURL", err)
	_, err = l.TryAcquire(ctx, "k")
	check("locker TryAcquire", err)
	if !errors.Is(err, locker.ErrUnavailable) {
		t.Errorf("locker TryAcquire: %v, want locker.ErrUnavailable", err)
	}
	_, err = d.Acquire(ctx, "k", "o", time.Minute)
	check("Acquire", err)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = d.AcquireWait(wctx, "k", "o", time.Minute)
	cancel()
	check("AcquireWait", err)
	_, err = d.Inspect(ctx, "k")
	check("Inspect", err)
	check("Ping", d.Ping(ctx))
}
