package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-locker/locker/driver"
)

// New(ctx, dir, opts) is Open with the directory and options given in Go.
func TestNew(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "a")
	l, err := New(ctx, dir+"/", &Options{Perm: 0o660})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Dir() != dir {
		t.Fatalf("Dir() = %q, want %q", l.Dir(), dir)
	}
	if _, err := l.Acquire(ctx, "k", "me", 0); !errors.Is(err, driver.ErrInvalid) {
		t.Fatalf("Acquire with ttl 0: %v", err)
	}
	for _, ko := range [][2]string{{"", "me"}, {"k", ""}} {
		if _, err := l.WatchHold(ko[0], ko[1], 1, func(error) {}); !errors.Is(err, driver.ErrInvalid) {
			t.Fatalf("WatchHold(%q, %q): %v, want ErrInvalid", ko[0], ko[1], err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, tokenFile)); err != nil || l.perm != 0o660 {
		t.Fatalf("token file: %v; perm %o, want 0660", err, l.perm)
	}

	// The same directory through Open excludes it.
	o, err := Open(ctx, "file://"+dir)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := l.Acquire(ctx, "k", "me", 10e9); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Acquire(ctx, "k", "you", 10e9); !errors.Is(err, driver.ErrNotAcquired) {
		t.Fatalf("Acquire through Open on a key held through New: %v", err)
	}

	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	d, err := New(ctx, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if d.Dir() != DefaultDir() {
		t.Fatalf("New with no dir: Dir() = %q, want %q", d.Dir(), DefaultDir())
	}

	for _, tc := range []struct {
		dir  string
		opts *Options
	}{
		{"relative/dir", nil},
		{dir, &Options{Perm: 0o700}},
		{dir, &Options{Perm: 0o400}},
	} {
		if _, err := New(ctx, tc.dir, tc.opts); !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("New(%q, %+v) = %v, want ErrInvalid", tc.dir, tc.opts, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := New(cctx, dir, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("New with a cancelled ctx: %v", err)
	}
	if _, err := Open(cctx, "file://"+dir); !errors.Is(err, context.Canceled) {
		t.Errorf("Open with a cancelled ctx: %v", err)
	}
}
