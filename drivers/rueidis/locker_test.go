package rueidis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

var ownerSeq atomic.Int64

func newOwner() string { return fmt.Sprintf("owner-%d-%d", time.Now().UnixNano(), ownerSeq.Add(1)) }

// openT opens a Locker on dsn and closes it at cleanup.
func openT(t testing.TB, dsn string) *Locker {
	t.Helper()
	l, err := Open(dsn)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func urlOf(addrs ...string) string { return Scheme + "://" + strings.Join(addrs, ",") }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestBasics(t *testing.T) {
	s := redistest.Start(t)
	a, b := openT(t, urlOf(s.Addr)), openT(t, urlOf(s.Addr))
	ctx := ctxT(t, 30*time.Second)
	oa, ob := newOwner(), newOwner()
	tok, err := a.Acquire(ctx, "k", oa, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	tok2, err := a.Acquire(ctx, "k", oa, 10*time.Second)
	if err != nil || tok2 != tok {
		t.Fatalf("idempotent acquire: %d, %v; want %d", tok2, err, tok)
	}
	_, err = b.Acquire(ctx, "k", ob, time.Second)
	var he *driver.HeldError
	if !errors.As(err, &he) || he.Remaining <= 0 || he.Remaining > 10*time.Second {
		t.Fatalf("contended acquire: %v", err)
	}
	if err := b.Release(ctx, "k", ob); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("release by non-owner: %v", err)
	}
	if err := b.Refresh(ctx, "k", ob, time.Second); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh by non-owner: %v", err)
	}
	in, err := b.Inspect(ctx, "k")
	if err != nil || in.Owner != oa || in.Token != tok {
		t.Fatalf("inspect: %+v %v", in, err)
	}

	wake, cancel, err := b.Subscribe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	if err := a.Release(ctx, "k", oa); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	case <-ctx.Done():
		t.Fatal("no wake-up after release")
	}
	tok3, err := b.Acquire(ctx, "k", ob, time.Second)
	if err != nil || tok3 <= tok {
		t.Fatalf("acquire after release: %d %v (previous token %d)", tok3, err, tok)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Acquire(ctx, "k", oa, time.Second); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("acquire after close: %v", err)
	}
	if _, _, err := a.Subscribe(ctx, "k"); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("subscribe after close: %v", err)
	}
}

func itoa(n int) string { return fmt.Sprint(n) }
