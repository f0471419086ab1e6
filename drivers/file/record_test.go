package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func itoa(i int) string { return strconv.Itoa(i) }

func TestLeaseRoundTrip(t *testing.T) {
	for _, r := range []lease{
		{token: 1, boot: "b", expires: 2, owner: "o", key: "k"},
		{token: 1<<64 - 1, boot: "91b54395-00d1-4045-9804-259d6cb0c25a", expires: -5, owner: `a "quoted" owner`, key: "a key with spaces\nand a newline"},
		{token: 7, boot: "b", expires: time.Now().UnixNano(), owner: "ünïcödé", key: "\x00\xff binary"},
		{token: 9, boot: "b", key: "released"},
	} {
		b := r.encode(nil)
		got, ok := decode(b)
		if !ok || got != r {
			t.Errorf("decode(encode(%+v)) = %+v, %v (line %q)", r, got, ok, b)
		}
		// A stale tail after the record (a crash between write and
		// truncate) is ignored.
		if got, ok := decode(append(b, "2 99 b 99 \"x\" \"y\"\n"...)); !ok || got != r {
			t.Errorf("decode with a tail = %+v, %v", got, ok)
		}
	}
}

// Version 1 records, written by earlier versions, are read: no boot id, the
// expiry on the wall clock.
func TestDecodeVersion1(t *testing.T) {
	r, ok := decode([]byte("1 42 1700000000000000000 \"o\" \"k\"\n"))
	if want := (lease{token: 42, expires: 1700000000000000000, owner: "o", key: "k"}); !ok || r != want {
		t.Fatalf("decode(v1) = %+v, %v; want %+v", r, ok, want)
	}
}

func TestDecodeGarbage(t *testing.T) {
	for _, s := range []string{"", "\n", "2 1 b 3 \"o\" \"k\"", "3 1 b 2 \"o\" \"k\"\n", "2 x b 2 \"o\" \"k\"\n", "2 1 b y \"o\" \"k\"\n",
		"2 1 b 2 o \"k\"\n", "2 1 b 2 \"o\" k\n", "2 1 b 2 \"o\"\n", "2 1  2 \"o\" \"k\"\n", "2 1 2 \"o\" \"k\"\n",
		"1 1 2 o \"k\"\n", "1 x 2 \"o\" \"k\"\n"} {
		if r, ok := decode([]byte(s)); ok {
			t.Errorf("decode(%q) = %+v, want no lease", s, r)
		}
	}
}

func TestFileName(t *testing.T) {
	a, b := fileName("a"), fileName("b")
	if a == b || len(a) != 44 || filepath.Ext(a) != ".lck" || fileName("a") != a {
		t.Fatalf("fileName: %q %q", a, b)
	}
}

// A process that holds the flock (stopped, or slow) delays others only as
// long as their ctx allows.
func TestFlockRespectsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	fd, err := flockFile(context.Background(), path, unix.LOCK_EX, true, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = flockFile(ctx, path, unix.LOCK_SH, false, 0o600)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flockFile under a held flock = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("returned after %v", d)
	}
}

// A file unlinked between open and flock is detected and reopened.
func TestFlockReopensUnlinked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	fd, err := flockFile(context.Background(), path, unix.LOCK_EX, true, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		fd2, err := flockFile(context.Background(), path, unix.LOCK_EX, true, 0o600)
		if err == nil {
			var st1, st2 unix.Stat_t
			_ = unix.Fstat(fd2, &st1)
			err = unix.Stat(path, &st2)
			if err == nil && st1.Ino != st2.Ino {
				err = errors.New("locked an unlinked file")
			}
			unix.Close(fd2)
		}
		got <- err
	}()
	// Wait until the goroutine has the file open (it polls the flock),
	// then unlink it under our flock, as Release does.
	deadline := time.Now().Add(10 * time.Second)
	for openCount(t, path) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("second opener never opened the file")
		}
		time.Sleep(time.Millisecond)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// openCount counts this process's open descriptors on path.
func openCount(t *testing.T, path string) int {
	var want unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return 0
	}
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		var st unix.Stat_t
		if unix.Stat("/proc/self/fd/"+e.Name(), &st) == nil && st.Ino == want.Ino && st.Dev == want.Dev {
			n++
		}
	}
	return n
}
