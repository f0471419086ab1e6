package mem_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// Keys and owners are opaque: with spaces, colons, newlines, braces, NUL
// and non-UTF-8 bytes, a waiter is woken and granted within 100ms of the
// release, Inspect reports the exact owner, and no two keys interfere.
func TestOpaqueKeyHandoff(t *testing.T) {
	var h handoffs
	defer func() { h.check(t) }()
	s := mem.NewStore()
	ctx := context.Background()
	a, b := s.Locker(), s.Locker()
	n := len(opaqueNames)
	toks := map[string]uint64{}
	for i, key := range opaqueNames {
		toks[key] = opaqueHandoff(t, ctx, &h, a, b, key, opaqueNames[(i+1)%n], opaqueNames[(i+2)%n], time.Minute)
	}
	for i, key := range opaqueNames {
		in, err := a.(driver.Inspector).Inspect(ctx, key)
		if err != nil || in.Owner != opaqueNames[(i+2)%n] || in.Token != toks[key] {
			t.Errorf("Inspect(%q) after every handoff = %+v, %v", key, in, err)
		}
	}
}

// opaqueNames are keys, owners and prefix segments that a separator-based
// encoding would split or mangle: spaces, colons, newlines, braces (Redis
// Cluster hash tags), NUL and bytes that are not UTF-8.
var opaqueNames = []string{
	"tenant 42/report",
	"a:b::c:",
	"line one\nline two\r\n",
	"{slot}:{x}",
	"\xff\xfe\x80 not UTF-8",
	" sp:{}\n\xff\x00 ",
}

// handoffBound is how soon after a release a subscribed waiter must be
// granted the key: the median over a test's handoffs. handoffMax bounds
// every single one, far below any TTL or poll, so that a lost wake-up
// fails even on a machine loaded enough to delay one handoff past
// handoffBound.
const (
	handoffBound = 100 * time.Millisecond
	handoffMax   = time.Second
)

// handoffs records the handoff times of one test.
type handoffs []time.Duration

// check requires the median handoff within handoffBound and logs the
// figures.
func (h handoffs) check(t *testing.T) {
	t.Helper()
	if len(h) == 0 {
		return
	}
	s := slices.Sorted(slices.Values(h))
	med := s[len(s)/2]
	t.Logf("%d handoffs: median %v, max %v", len(s), med, s[len(s)-1])
	if med > handoffBound {
		t.Errorf("median handoff %v, want at most %v", med, handoffBound)
	}
}

// opaqueHandoff has a take key as ownerA, checks that b sees that holder
// through Inspect, subscribes b, releases through a, and requires b to be
// granted key as ownerB within handoffMax of the release, adding the time
// taken to *h. It returns b's token, which must be above a's.
func opaqueHandoff(t *testing.T, ctx context.Context, h *handoffs, a, b driver.Locker, key, ownerA, ownerB string, ttl time.Duration) uint64 {
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
		if d > handoffMax {
			t.Errorf("key %q: handoff took %v, want at most %v", key, d, handoffMax)
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
