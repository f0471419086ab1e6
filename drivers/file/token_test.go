package file

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Tokens keep increasing when the counter file is lost or damaged, when the
// whole directory is wiped, and when the counter is ahead of the clock.
func TestTokenSurvivesCounterLoss(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	ctx := ctxT(t)
	counter := filepath.Join(dir, tokenFile)
	last := uint64(0)
	grant := func(what string) {
		t.Helper()
		tok, err := l.Acquire(ctx, "k", "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("%s: token %d not above %d", what, tok, last)
		}
		last = tok
		if err := l.Release(ctx, "k", "o"); err != nil {
			t.Fatal(err)
		}
	}
	grant("first")
	grant("second")
	if err := os.Remove(counter); err != nil {
		t.Fatal(err)
	}
	grant("after the counter was removed")
	if err := os.WriteFile(counter, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	grant("after the counter was damaged")
	// The directory wiped (a tmpfs emptied at reboot): the clock floors it.
	for _, f := range []string{counter, l.Path("k")} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	grant("after the directory was wiped")
	future := uint64(time.Now().Add(time.Hour).UnixMicro())
	if err := os.WriteFile(counter, []byte(strconv.FormatUint(future, 10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grant("with the counter ahead of the clock")
	if last != future+1 {
		t.Fatalf("token %d, want the counter's %d + 1", last, future)
	}
	grant("next")
}

// Tokens are shared by all keys of a directory, and strictly increase.
func TestTokensAcrossKeys(t *testing.T) {
	l := open(t, t.TempDir())
	ctx := ctxT(t)
	var last uint64
	for i := range 50 {
		key := "k" + strconv.Itoa(i%3)
		tok, err := l.Acquire(ctx, key, "o", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if tok <= last {
			t.Fatalf("token %d after %d", tok, last)
		}
		last = tok
		if err := l.Release(ctx, key, "o"); err != nil {
			t.Fatal(err)
		}
	}
}
