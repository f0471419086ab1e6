package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-locker/locker/driver"
)

func TestParseDSN(t *testing.T) {
	t.Setenv("TMPDIR", "/tmp/x")
	for _, tc := range []struct {
		dsn  string
		dir  string
		def  bool
		perm os.FileMode
	}{
		{"file://", "/tmp/x/locker-" + itoa(os.Getuid()), true, 0o600},
		{"FILE://", "/tmp/x/locker-" + itoa(os.Getuid()), true, 0o600},
		{"file:///var/lock/app", "/var/lock/app", false, 0o600},
		{"file:///var/lock/app/", "/var/lock/app", false, 0o600},
		{"file://localhost/var/lock/app", "/var/lock/app", false, 0o600},
		{"file:///var/lock/app?perm=0660", "/var/lock/app", false, 0o660},
		{"file://?perm=666", "/tmp/x/locker-" + itoa(os.Getuid()), true, 0o666},
		{"file:///a%20b", "/a b", false, 0o600},
	} {
		c, err := parseDSN(tc.dsn)
		if err != nil {
			t.Errorf("parseDSN(%q): %v", tc.dsn, err)
			continue
		}
		if c.dir != tc.dir || c.defaultDir != tc.def || c.perm != tc.perm {
			t.Errorf("parseDSN(%q) = %+v, want dir %q default %v perm %o", tc.dsn, c, tc.dir, tc.def, tc.perm)
		}
	}
}

func TestParseDSNInvalid(t *testing.T) {
	for dsn, want := range map[string]string{
		"redis://x":                       "scheme",
		"file:relative/dir":               "relative path",
		"file://host/dir":                 "host",
		"file://u:p@localhost/dir":        "user information",
		"file:///dir?perm=0700":           "perm",
		"file:///dir?perm=0400":           "perm",
		"file:///dir?perm=abc":            "perm",
		"file:///dir?perm=0600&perm=0600": "2 times",
		"file:///dir?ttl=1s":              `unknown query parameter "ttl"`,
		"file:///dir#frag":                "fragment",
		"file:///dir?%zz":                 "malformed query",
		"file://%zz/":                     "malformed URL",
	} {
		_, err := Open(context.Background(), dsn)
		if !errors.Is(err, driver.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want ErrInvalid", dsn, err)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "file: ") {
			t.Errorf("Open(%q) = %q, want a file: error mentioning %q", dsn, err, want)
		}
		if strings.Contains(err.Error(), ":p@") {
			t.Errorf("Open(%q) leaks the password: %v", dsn, err)
		}
	}
}

func TestOpenCreatesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	l, err := Open(context.Background(), "file://"+dir+"?perm=0660")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.Dir() != dir {
		t.Fatalf("Dir() = %q, want %q", l.Dir(), dir)
	}
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		t.Fatalf("directory not created: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, tokenFile)); err != nil {
		t.Fatalf("token counter not created: %v", err)
	}
}

func TestOpenUnusableDir(t *testing.T) {
	f := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(f, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), "file://"+f+"/sub")
	if err == nil || errors.Is(err, driver.ErrInvalid) || !strings.HasPrefix(err.Error(), "file: ") {
		t.Fatalf("Open under a regular file = %v, want a file system error", err)
	}
}

func TestOpenDefaultDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	l, err := Open(context.Background(), "file://")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	want := filepath.Join(tmp, "locker-"+itoa(os.Getuid()))
	if l.Dir() != want || DefaultDir() != want {
		t.Fatalf("Dir() = %q, DefaultDir() = %q, want %q", l.Dir(), DefaultDir(), want)
	}
	st, err := os.Stat(want)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("default dir mode = %v, %v; want 0700", st.Mode(), err)
	}
	// A default directory others can write to is refused.
	if err := os.Chmod(want, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), "file://"); err == nil || !strings.Contains(err.Error(), "writable by other users") {
		t.Fatalf("Open with a world-writable default dir = %v", err)
	}
	// So is a file planted in its place.
	if err := os.RemoveAll(want); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(want, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(context.Background(), "file://"); err == nil {
		t.Fatal("Open with a file as the default dir succeeded")
	}
}

func TestDirPerm(t *testing.T) {
	for perm, want := range map[os.FileMode]os.FileMode{0o600: 0o700, 0o660: 0o770, 0o640: 0o750, 0o666: 0o777, 0o604: 0o705} {
		if got := dirPerm(perm); got != want {
			t.Errorf("dirPerm(%o) = %o, want %o", perm, got, want)
		}
	}
}
