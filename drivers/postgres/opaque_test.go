package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// opaqueNames are keys and owners with the bytes that a split or a text
// encoding would trip on: spaces, colons, newlines, braces, bytes that are
// not UTF-8, and NUL.
var opaqueNames = []string{
	"tenant 42/report",
	"a:b::c:",
	"line one\nline two\r\n",
	"{slot}:{x}",
	"\xff\xfe\x80 not UTF-8",
	" sp:{}\n\xff\x00 ",
	"nul\x00in the middle",
}

// Bounds on a handoff: the median over a test's handoffs, and every single
// one (far below any TTL or fallback, so a lost wake-up fails even on a
// loaded machine).
const (
	handoffBound = 100 * time.Millisecond
	handoffMax   = time.Second
)

// Keys and owners are opaque bytes in both modes: for each of opaqueNames
// as the key (with others as owners), a waiter blocked in AcquireWait is
// granted within handoffMax of the holder's release (the median within
// handoffBound), with a higher token; Inspect reports the exact owner
// through the Locker that holds the lock, and through another Locker the
// exact owner in lease mode and the owner tag in advisory mode; in
// advisory mode the hold watch reports the end of the holder's session.
func TestOpaqueKeyHandoff(t *testing.T) {
	url := serverURL(t)
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		t.Run(mode, func(t *testing.T) {
			open := openT
			if mode == ModeLease {
				open = openLeaseT
			}
			a, b := open(t, url), open(t, url)
			p := poolT(t, url)
			ctx := ctxFor(t, 2*time.Minute)
			// A first wait sets up the lease-mode waiter's LISTEN connection.
			warm := fmt.Sprintf("opaque/warm/%d", time.Now().UnixNano())
			if _, err := b.AcquireWait(ctx, warm, "w", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := b.Release(ctx, warm, "w"); err != nil {
				t.Fatal(err)
			}
			var hs []time.Duration
			n := len(opaqueNames)
			run := fmt.Sprintf("opaque/%d/", time.Now().UnixNano())
			for i, name := range opaqueNames {
				key := run + name
				ownerA, ownerB := opaqueNames[(i+1)%n], opaqueNames[(i+2)%n]
				hs = append(hs, opaqueHandoff(t, ctx, a, b, p, key, ownerA, ownerB))
				// The bare name as a key too (prefix-free).
				hs = append(hs, opaqueHandoff(t, ctx, b, a, p, name+fmt.Sprint(time.Now().UnixNano()), ownerB, ownerA))
			}
			slices.Sort(hs)
			med := hs[len(hs)/2]
			t.Logf("%s: %d handoffs: median %v, max %v", mode, len(hs), med, hs[len(hs)-1])
			if med > handoffBound {
				t.Errorf("median handoff %v, want at most %v", med, handoffBound)
			}
		})
	}
}

// opaqueHandoff has a take key as ownerA, checks Inspect, blocks b in
// AcquireWait as ownerB behind it, releases through a and requires b's
// grant within handoffMax; then checks Inspect and the hold watch of b's
// lock and lets it go. It returns the time from the release to b's grant.
func opaqueHandoff(t *testing.T, ctx context.Context, a, b *Locker, p rowQuerier, key, ownerA, ownerB string) time.Duration {
	t.Helper()
	tokA, err := a.Acquire(ctx, key, ownerA, time.Minute)
	if err != nil {
		t.Fatalf("Acquire(%q, %q): %v", key, ownerA, err)
	}
	checkOwner(t, ctx, a, b, key, ownerA, tokA)
	if _, err := b.Acquire(ctx, key, ownerB, time.Minute); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire(%q, %q) while %q holds it: %v, want ErrNotAcquired", key, ownerB, ownerA, err)
	}
	type result struct {
		tok uint64
		at  time.Time
		err error
	}
	got := make(chan result, 1)
	go func() {
		tok, err := b.AcquireWait(ctx, key, ownerB, time.Minute)
		got <- result{tok, time.Now(), err}
	}()
	if a.Mode() == ModeAdvisory {
		// The waiter is queued in the server's lock manager.
		for deadline := time.Now().Add(10 * time.Second); queuedFor(t, p, key) != 1; {
			if time.Now().After(deadline) {
				t.Fatalf("key %q: the waiter was not queued in the server within 10s", key)
			}
			time.Sleep(2 * time.Millisecond) // polling the server is the check
		}
	}
	released := time.Now()
	if err := a.Release(ctx, key, ownerA); err != nil {
		t.Fatalf("Release(%q, %q): %v", key, ownerA, err)
	}
	var r result
	select {
	case r = <-got:
	case <-time.After(handoffMax):
		t.Fatalf("key %q: the waiter was not granted within %v of the release", key, handoffMax)
	}
	if r.err != nil || r.tok <= tokA {
		t.Fatalf("AcquireWait(%q, %q) = %d, %v; want a token above %d", key, ownerB, r.tok, r.err, tokA)
	}
	d := r.at.Sub(released)
	checkOwner(t, ctx, b, a, key, ownerB, r.tok)
	if b.Mode() == ModeLease {
		if _, err := b.WatchHold(key, ownerB, r.tok, func(error) {}); !errors.Is(err, errors.ErrUnsupported) {
			t.Fatalf("lease WatchHold: %v, want ErrUnsupported", err)
		}
		if err := b.Release(ctx, key, ownerB); err != nil {
			t.Fatalf("Release(%q, %q): %v", key, ownerB, err)
		}
		return d
	}
	lost := make(chan error, 1)
	stop, err := b.WatchHold(key, ownerB, r.tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatalf("WatchHold(%q, %q): %v", key, ownerB, err)
	}
	defer stop()
	pid := holderPID(t, p, DefaultNamespace, key)
	var ok bool
	if err := p.QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
		t.Fatalf("pg_terminate_backend(%d): %v, %v", pid, ok, err)
	}
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatalf("key %q: the hold watch did not report the terminated session within 5s", key)
	}
	if err := b.Release(ctx, key, ownerB); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("Release(%q, %q) after its session ended: %v, want ErrNotHeld", key, ownerB, err)
	}
	return d
}

// checkOwner requires Inspect of key to report owner and tok: exactly
// through holder, and through other exactly in lease mode and as the
// owner tag in advisory mode.
func checkOwner(t *testing.T, ctx context.Context, holder, other *Locker, key, owner string, tok uint64) {
	t.Helper()
	in, err := holder.Inspect(ctx, key)
	if err != nil || in.Owner != owner || in.Token != tok || in.Remaining <= 0 {
		t.Fatalf("Inspect(%q) through the holder = %+v, %v; want owner %q token %d", key, in, err, owner, tok)
	}
	want := owner
	if other.Mode() == ModeAdvisory {
		want = ownerTag(owner)
	}
	in, err = other.Inspect(ctx, key)
	if err != nil || in.Owner != want || in.Token != tok || in.Remaining <= 0 {
		t.Fatalf("Inspect(%q) through another Locker = %+v, %v; want owner %q token %d", key, in, err, want, tok)
	}
}
