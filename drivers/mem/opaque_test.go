package mem_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
	"github.com/go-locker/locker/internal/opaquetest"
)

// Keys and owners are opaque: with spaces, colons, newlines, braces, NUL
// and non-UTF-8 bytes, a waiter is woken and granted within 100ms of the
// release, Inspect reports the exact owner, and no two keys interfere.
func TestOpaqueKeyHandoff(t *testing.T) {
	var h opaquetest.Handoffs
	defer func() { h.Check(t) }()
	s := mem.NewStore()
	ctx := context.Background()
	a, b := s.Locker(), s.Locker()
	names := opaquetest.Names
	n := len(names)
	toks := opaquetest.Run(t, ctx, &h, a, b, opaquetest.Config{TTL: time.Minute})
	for i, key := range names {
		in, err := a.(driver.Inspector).Inspect(ctx, key)
		if err != nil || in.Owner != names[(i+2)%n] || in.Token != toks[key] {
			t.Errorf("Inspect(%q) after every handoff = %+v, %v", key, in, err)
		}
	}
}
