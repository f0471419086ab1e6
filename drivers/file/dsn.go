package file

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-locker/locker/internal/dsn"
)

// DefaultPerm is the permission of lock files when the URL has no perm
// parameter: read and write for the owning user only.
const DefaultPerm os.FileMode = 0o600

// config is a parsed data source name.
type config struct {
	dir        string      // absolute, cleaned
	defaultDir bool        // dir was chosen by DefaultDir
	perm       os.FileMode // lock and token file permission
}

// DefaultDir returns the directory used by the URL "file://":
// os.TempDir()/locker-<uid>. It is the same for every process of one user
// that sees the same TMPDIR, whether started from a shell, cron or systemd,
// so the default needs no configuration to exclude across them.
func DefaultDir() string {
	return filepath.Join(os.TempDir(), "locker-"+strconv.Itoa(os.Getuid()))
}

// parseDSN parses "file://", "file:///abs/dir" or "file://localhost/abs/dir"
// with an optional perm query parameter. Every error wraps driver.ErrInvalid.
func parseDSN(raw string) (config, error) {
	u, err := dsn.Parse("file", raw, "file", "file")
	if err != nil {
		return config{}, err
	}
	switch h := u.Host; {
	case u.Opaque != "":
		return config{}, dsn.Invalid("file", "relative path %q, want file:///absolute/dir or file://", u.Opaque)
	case u.User != nil:
		return config{}, dsn.Invalid("file", "URL has user information, which a file URL cannot use")
	case h != "" && !strings.EqualFold(h, "localhost"):
		return config{}, dsn.Invalid("file", "host %q, want none or localhost (file locks are local to one host)", h)
	}
	c := config{perm: DefaultPerm}
	switch p := u.Path; {
	case p == "":
		c.dir, c.defaultDir = DefaultDir(), true
	case !strings.HasPrefix(p, "/"):
		return config{}, dsn.Invalid("file", "path %q is not absolute", p)
	default:
		c.dir = filepath.Clean(p)
	}
	q, err := dsn.NewQuery("file", u)
	if err != nil {
		return config{}, err
	}
	v, ok, err := q.Lookup("perm")
	if err != nil {
		return config{}, err
	}
	if ok {
		if c.perm, err = parsePerm(v); err != nil {
			return config{}, err
		}
	}
	if err := q.Done(); err != nil {
		return config{}, err
	}
	return c, nil
}

// parsePerm parses the octal perm parameter: between 0600 and 0666.
func parsePerm(v string) (os.FileMode, error) {
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n&^0o666 != 0 || n&0o600 != 0o600 {
		return 0, dsn.Invalid("file", "perm=%q: want octal permission bits between 0600 and 0666", v)
	}
	return os.FileMode(n), nil
}

// dirPerm is the permission of a directory created for files of perm: the
// read/write bits of perm plus the matching search bits.
func dirPerm(perm os.FileMode) os.FileMode {
	d := perm & 0o666
	if d&0o040 != 0 {
		d |= 0o010
	}
	if d&0o004 != 0 {
		d |= 0o001
	}
	return d | 0o700
}
