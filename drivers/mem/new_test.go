package mem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// Open(ctx, dsn) and New(ctx, store, opts) return *mem.Locker on the same
// stores as the registered driver and Store.Locker.
func TestOpenAndNew(t *testing.T) {
	ctx := context.Background()
	a, err := mem.Open(ctx, "mem://open-and-new")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := locker.OpenURL("mem://open-and-new")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := a.Acquire(ctx, "k", "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryAcquire(ctx, "k"); !errors.Is(err, locker.ErrNotAcquired) {
		t.Fatalf("same named store through the registry: %v, want ErrNotAcquired", err)
	}

	s := mem.NewStore()
	n, err := mem.New(ctx, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Acquire(ctx, "k", "n", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Locker().Acquire(ctx, "k", "other", time.Minute); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("same store through Store.Locker: %v, want ErrNotAcquired", err)
	}
	if in, err := n.Inspect(ctx, "k"); err != nil || in.Owner != "n" {
		t.Fatalf("Inspect: %+v, %v", in, err)
	}
	if _, err := mem.New(ctx, nil, &mem.Options{}); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("New(nil store): %v, want ErrInvalid", err)
	}
	if _, err := mem.Open(ctx, "mem://x?ttl=1"); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Open with a query: %v, want ErrInvalid", err)
	}
}
