// Package opaquetest holds the opaque-key handoff test that the drivers'
// tests share: keys and owners with spaces, colons, newlines, braces, NUL
// and non-UTF-8 bytes are taken, inspected, handed to a waiter in another
// Locker within a bound of the release, and (where the driver watches its
// grants) reported lost when the server drops them. It is imported by test
// code only.
package opaquetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// Names are keys, owners and prefix segments that a separator-based
// encoding would split or mangle: spaces, colons, newlines, braces (Redis
// Cluster hash tags), NUL and bytes that are not UTF-8.
var Names = []string{
	"tenant 42/report",
	"a:b::c:",
	"line one\nline two\r\n",
	"{slot}:{x}",
	"\xff\xfe\x80 not UTF-8",
	" sp:{}\n\xff\x00 ",
}

// HandoffBound is how soon after a release a subscribed waiter must be
// granted the key: the median over a test's handoffs. HandoffMax bounds
// every single one, far below any TTL or poll, so that a lost wake-up
// fails even on a machine loaded enough to delay one handoff past
// HandoffBound.
const (
	HandoffBound = 100 * time.Millisecond
	HandoffMax   = time.Second
)

// Handoffs records the handoff times of one test.
type Handoffs []time.Duration

// Check requires the median handoff within HandoffBound and logs the
// figures. It does nothing when no handoff was recorded.
func (h Handoffs) Check(t *testing.T) {
	t.Helper()
	if len(h) == 0 {
		return
	}
	s := slices.Sorted(slices.Values(h))
	med := s[len(s)/2]
	t.Logf("%d handoffs: median %v, max %v", len(s), med, s[len(s)-1])
	if med > HandoffBound {
		t.Errorf("median handoff %v, want at most %v", med, HandoffBound)
	}
}

// Config is what differs between the drivers in Run.
type Config struct {
	// TTL is the TTL of every grant and of the Refresh before a hold watch
	// is checked.
	TTL time.Duration
	// After, if not nil, is called after the handoff of each key with the
	// owner and token b was granted, for the driver's own checks (such as
	// its stored layout).
	After func(key, ownerB string, tok uint64)
	// Lose, if not nil, makes the server drop b's grant of key behind b's
	// back; b must then be a driver.HoldWatcher whose watch of that grant
	// reports ErrNotHeld within 5s. Nil skips the hold watch check.
	Lose func(key string) error
	// Lost names what Lose removes, in failure messages.
	Lost string
}

// Run hands every key of Names from a to b, as in Handoff with owners
// taken from Names, adding the times to *h, then runs c.After and the hold
// watch check of c.Lose for that key. It returns b's token for each key.
func Run(t *testing.T, ctx context.Context, h *Handoffs, a, b driver.Locker, c Config) map[string]uint64 {
	t.Helper()
	n := len(Names)
	toks := map[string]uint64{}
	for i, key := range Names {
		ownerB := Names[(i+2)%n]
		tok := Handoff(t, ctx, h, a, b, key, Names[(i+1)%n], ownerB, c.TTL)
		toks[key] = tok
		if c.After != nil {
			c.After(key, ownerB, tok)
		}
		if c.Lose != nil {
			checkLoss(t, ctx, b, key, ownerB, tok, c)
		}
	}
	return toks
}

// checkLoss watches b's grant of key to owner, refreshes it, has c.Lose
// drop it and requires the watch to report ErrNotHeld within 5s.
func checkLoss(t *testing.T, ctx context.Context, b driver.Locker, key, owner string, tok uint64, c Config) {
	t.Helper()
	lost := make(chan error, 1)
	stop, err := b.(driver.HoldWatcher).WatchHold(key, owner, tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := b.Refresh(ctx, key, owner, c.TTL); err != nil {
		t.Fatal(err)
	}
	if err := c.Lose(key); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, driver.ErrNotHeld) {
			t.Errorf("key %q: hold watch reported %v, want ErrNotHeld", key, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("key %q: hold watch did not report the %s within 5s", key, c.Lost)
	}
}

// Handoff has a take key as ownerA, checks that b sees that holder
// through Inspect, subscribes b, releases through a, and requires b to be
// granted key as ownerB within HandoffMax of the release, adding the time
// taken to *h. It returns b's token, which must be above a's. a and b must
// be driver.Inspector and b a driver.Waiter.
func Handoff(t *testing.T, ctx context.Context, h *Handoffs, a, b driver.Locker, key, ownerA, ownerB string, ttl time.Duration) uint64 {
	t.Helper()
	tokA, err := a.Acquire(ctx, key, ownerA, ttl)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, ownerA, err)
	}
	in, err := b.(driver.Inspector).Inspect(ctx, key)
	if err != nil || in.Owner != ownerA || in.Token != tokA || in.Remaining <= 0 {
		t.Fatalf("Inspect(%q) = %+v, %v; want owner %q token %d", key, in, err, ownerA, tokA)
	}
	if _, err := b.Acquire(ctx, key, ownerB, ttl); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire(%q, %q) while %q holds it: %v, want ErrNotAcquired", key, ownerB, ownerA, err)
	}
	wake, cancel, err := b.(driver.Waiter).Subscribe(ctx, key)
	if err != nil {
		t.Fatalf("Subscribe(%q): %v", key, err)
	}
	defer cancel()
	start := time.Now()
	if err := a.Release(ctx, key, ownerA); err != nil {
		t.Fatalf("Release(%q, %q): %v", key, ownerA, err)
	}
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case <-wake:
		case <-deadline.C:
			t.Fatalf("key %q: the waiter was not woken within 5s of the release", key)
		}
		tok, err := b.Acquire(ctx, key, ownerB, ttl)
		if errors.Is(err, driver.ErrNotAcquired) {
			continue // an early wake-up: wait for the next
		}
		if err != nil {
			t.Fatalf("Acquire(%q, %q) after the release: %v", key, ownerB, err)
		}
		d := time.Since(start)
		*h = append(*h, d)
		if d > HandoffMax {
			t.Errorf("key %q: handoff took %v, want at most %v", key, d, HandoffMax)
		}
		if tok <= tokA {
			t.Errorf("key %q: token %d after %d", key, tok, tokA)
		}
		in, err := a.(driver.Inspector).Inspect(ctx, key)
		if err != nil || in.Owner != ownerB || in.Token != tok {
			t.Fatalf("Inspect(%q) after the handoff = %+v, %v; want owner %q token %d", key, in, err, ownerB, tok)
		}
		return tok
	}
}
