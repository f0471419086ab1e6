package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// TestElectionMaxOwner: advisory mode declares the owners Inspect reports
// back exactly (34 printable ASCII bytes, the room application_name leaves
// for the owner tag) and package locker holds elections to it: an 18-byte
// printable value (34 less the 16-byte election owner prefix) is elected
// and seen by another Locker as given; a longer or non-ASCII value is
// ErrInvalid naming the limit, and nothing is held. The declared limit is
// the real one: a 34-byte owner comes back as given through another
// Locker, a 35-byte one as a hash. Lease mode declares none: a 240-byte
// value of any bytes is seen as given.
func TestElectionMaxOwner(t *testing.T) {
	url := serverURL(t)
	ctx := ctxFor(t, 60*time.Second)
	a, b := openT(t, url), openT(t, url)
	if c := a.Capabilities(); c.MaxOwner != maxOwnerTag || maxOwnerTag != 34 || !c.OwnerASCII {
		t.Fatalf("advisory Capabilities: MaxOwner %d OwnerASCII %v, want 34 (maxOwnerTag %d) and true", c.MaxOwner, c.OwnerASCII, maxOwnerTag)
	}
	key := "maxowner/" + time.Now().Format(time.RFC3339Nano)
	for _, n := range []int{34, 35} {
		owner := strings.Repeat("o", n)
		if _, err := a.Acquire(ctx, key, owner, time.Minute); err != nil {
			t.Fatal(err)
		}
		in, err := b.Inspect(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if got := in.Owner == owner; got != (n <= 34) {
			t.Errorf("a %d-byte owner seen by another Locker as %q", n, in.Owner)
		}
		if err := a.Release(ctx, key, owner); err != nil {
			t.Fatal(err)
		}
	}

	la, lb := locker.New(a), locker.New(b)
	e := la.Election("maxowner-" + time.Now().Format(time.RFC3339Nano))
	value := strings.Repeat("v", 18)
	lk, err := e.Campaign(ctx, value, locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Campaign with an 18-byte value: %v", err)
	}
	if ld, err := lb.Election(e.Name()).Leader(ctx); err != nil || ld.Value != value || ld.Term != lk.Token() {
		t.Fatalf("Leader through another Locker: %+v %v, want %q at term %d", ld, err, value, lk.Token())
	}
	if err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct{ value, want string }{
		{strings.Repeat("v", 19), "the limit is 18"},
		{"vé", "not printable ASCII"},
	} {
		_, err := e.Campaign(ctx, bad.value)
		if !errors.Is(err, locker.ErrInvalid) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Campaign with %q: %v, want ErrInvalid saying %q", bad.value, err, bad.want)
		}
	}
	if _, err := e.Leader(ctx); !errors.Is(err, locker.ErrNotHeld) {
		t.Errorf("Leader after refused campaigns: %v, want ErrNotHeld", err)
	}

	lease := openT(t, leaseURL(url))
	if c := lease.Capabilities(); c.MaxOwner != 0 || c.OwnerASCII {
		t.Fatalf("lease Capabilities: MaxOwner %d OwnerASCII %v, want none", c.MaxOwner, c.OwnerASCII)
	}
	ll := locker.New(lease)
	value = strings.Repeat("é/ \x00", locker.MaxElectionValue/5)
	lk, err = ll.Election(e.Name()).Campaign(ctx, value, locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("lease mode: Campaign with a %d-byte value: %v", len(value), err)
	}
	defer lk.Release(ctx)
	if ld, err := locker.New(openT(t, leaseURL(url))).Election(e.Name()).Leader(ctx); err != nil || ld.Value != value {
		t.Fatalf("lease mode: Leader %+v %v, want the value as given", ld, err)
	}
}

// TestElectionObserveLeaseExpiry: in lease mode an expiry announces
// nothing, so an observer (notified of grants and releases) reads the
// holder again when the leader's lock would run out: a leader that dies
// (never renews, never releases) is reported gone within 250ms of its TTL,
// not at the observer's 2s safety read (it was, 1.5s after the TTL, when
// Observe did not read at the leader's remaining TTL); and the next grant
// is reported at once.
func TestElectionObserveLeaseExpiry(t *testing.T) {
	url := leaseURL(serverURL(t))
	ctx := ctxFor(t, 60*time.Second)
	obs, cand := locker.New(openLeaseT(t, url)), locker.New(openLeaseT(t, url))
	defer obs.Close()
	defer cand.Close()
	name := "observe-expiry/" + time.Now().Format(time.RFC3339Nano)
	type report struct {
		ld locker.Leader
		at time.Time
	}
	ch := make(chan report, 16)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for ld, err := range obs.Election(name).Observe(octx) {
			if err == nil {
				ch <- report{ld, time.Now()}
			}
		}
	}()
	next := func(what string) report {
		t.Helper()
		select {
		case r := <-ch:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("observer did not report %s", what)
		}
		return report{}
	}
	if r := next("nobody"); r.ld.Term != 0 {
		t.Fatalf("first report %+v, want nobody", r.ld)
	}
	// A leader that dies at once: its grant, taken through the driver with
	// an election owner ("~", 15 id bytes, the value), is never renewed
	// nor released.
	const ttl = 500 * time.Millisecond
	tok, err := cand.Driver().Acquire(ctx, locker.ElectionPrefix+name, "~abcdefghijklmnoa", ttl)
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	if r := next("the leader"); r.ld.Term != tok || r.ld.Value != "a" {
		t.Fatalf("report %+v, want a at term %d", r.ld, tok)
	}
	r := next("the expiry")
	if r.ld.Term != 0 {
		t.Fatalf("report %+v, want nobody after the expiry", r.ld)
	}
	if d := r.at.Sub(granted); d > ttl+250*time.Millisecond {
		t.Errorf("expiry reported %v after the grant, want within the %v TTL + 250ms", d, ttl)
	}
	lk2, err := cand.Election(name).Campaign(ctx, "b", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if r := next("the next leader"); r.ld.Term != lk2.Token() || r.at.Sub(at) > time.Second {
		t.Fatalf("report %+v %v after the grant, want term %d within 1s", r.ld, r.at.Sub(at), lk2.Token())
	}
	_ = lk2.Release(ctx)
}
