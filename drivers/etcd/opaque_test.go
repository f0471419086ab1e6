package etcd

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// Keys, owners and key prefixes are opaque: with spaces, colons, newlines,
// braces, NUL and non-UTF-8 bytes, a Locker opens on such a prefix (from
// the URL path and from Options.Prefix), a waiter in another Locker is
// woken and granted within 100ms of the release, Inspect reports the exact
// owner, the lock key is prefix+"/l/"+key byte for byte, and the hold watch
// reports the loss of such a grant.
func TestOpaqueKeyHandoff(t *testing.T) {
	var h handoffs
	defer func() { h.check(t) }()
	ctx := testCtx(t)
	n := len(opaqueNames)
	for _, seg := range append([]string{""}, opaqueNames...) {
		pfx := uniquePrefix(t)
		want := pfx
		if seg != "" {
			pfx += "/" + url.PathEscape(seg)
			want += "/" + strings.TrimSuffix(seg, "/")
		}
		a, err := Open(ctx, testURL(t)+pfx)
		if err != nil {
			t.Fatalf("Open with prefix %q: %v", want, err)
		}
		defer a.Close()
		b, err := Open(ctx, testURL(t)+pfx)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		c, err := New(ctx, a.Client(), &Options{Prefix: want})
		if err != nil {
			t.Fatalf("New with prefix %q: %v", want, err)
		}
		if a.Prefix() != want || c.Prefix() != want {
			t.Fatalf("prefix %q (Open), %q (New), want %q", a.Prefix(), c.Prefix(), want)
		}
		for i, key := range opaqueNames {
			ownerB := opaqueNames[(i+2)%n]
			tok := opaqueHandoff(t, ctx, &h, a, b, key, opaqueNames[(i+1)%n], ownerB, 5*time.Second)
			r, err := a.Client().Get(ctx, want+"/l/"+key)
			if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != ownerB || uint64(r.Kvs[0].CreateRevision) != tok {
				t.Fatalf("prefix %q key %q: lock key %v, %v", want, key, r, err)
			}
			if in, err := c.Inspect(ctx, key); err != nil || in.Owner != ownerB || in.Token != tok {
				t.Fatalf("Inspect through New: %+v, %v", in, err)
			}
			lost := make(chan error, 1)
			stop, err := b.WatchHold(key, ownerB, tok, func(err error) { lost <- err })
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Refresh(ctx, key, ownerB, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Client().Delete(ctx, a.LockKey(key)); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-lost:
				if !errors.Is(err, driver.ErrNotHeld) {
					t.Errorf("key %q: hold watch reported %v, want ErrNotHeld", key, err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("key %q: hold watch did not report the deleted lock key within 5s", key)
			}
			stop()
		}
		_ = c.Close()
	}
}

// No key under one prefix is a key under another: a prefix that would
// reach into another's lock keys (prefix+"/l/"+key) or wait queues
// (prefix+"/w/…") is refused before any I/O.
func TestPrefixesNeverShareKeys(t *testing.T) {
	ctx := testCtx(t)
	pfx := uniquePrefix(t)
	a, err := Open(ctx, testURL(t)+pfx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := a.Acquire(ctx, "x/l/k", "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, other := range []string{pfx + "/l/x", pfx + "/w/3:k/x", pfx + "/l", pfx + "/w/"} {
		if b, err := Open(ctx, testURL(t)+other); !errors.Is(err, driver.ErrInvalid) {
			if err == nil {
				_ = b.Close()
			}
			t.Errorf("Open with prefix %q beside %q: %v, want ErrInvalid", other, pfx, err)
		}
		if _, err := New(ctx, a.Client(), &Options{Prefix: other}); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("New with prefix %q: %v, want ErrInvalid", other, err)
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
