package etcd

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/opaquetest"
)

// Keys, owners and key prefixes are opaque: with spaces, colons, newlines,
// braces, NUL and non-UTF-8 bytes, a Locker opens on such a prefix (from
// the URL path and from Options.Prefix), a waiter in another Locker is
// woken and granted within 100ms of the release, Inspect reports the exact
// owner, the lock key is prefix+"/l/"+key byte for byte, and the hold watch
// reports the loss of such a grant.
func TestOpaqueKeyHandoff(t *testing.T) {
	var h opaquetest.Handoffs
	defer func() { h.Check(t) }()
	ctx := testCtx(t)
	for _, seg := range append([]string{""}, opaquetest.Names...) {
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
		opaquetest.Run(t, ctx, &h, a, b, opaquetest.Config{
			TTL: 5 * time.Second,
			After: func(key, ownerB string, tok uint64) {
				r, err := a.Client().Get(ctx, want+"/l/"+key)
				if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != ownerB || uint64(r.Kvs[0].CreateRevision) != tok {
					t.Fatalf("prefix %q key %q: lock key %v, %v", want, key, r, err)
				}
				if in, err := c.Inspect(ctx, key); err != nil || in.Owner != ownerB || in.Token != tok {
					t.Fatalf("Inspect through New: %+v, %v", in, err)
				}
			},
			Lose: func(key string) error {
				_, err := a.Client().Delete(ctx, a.LockKey(key))
				return err
			},
			Lost: "deleted lock key",
		})
		_ = c.Close()
	}
}

// No key under one prefix is a key under another: a prefix that would
// reach into another's lock keys (prefix+"/l/"+key) or wait queues
// (prefix+"/w/…", waiting Acquires' prefix+"/w/q/…" among them) is refused
// before any I/O.
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
	for _, other := range []string{pfx + "/l/x", pfx + "/w/3:k/x", pfx + "/w/q/3:k/x", pfx + "/l", pfx + "/w/"} {
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
