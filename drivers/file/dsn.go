package file

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/go-locker/locker/driver"
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
func parseDSN(dsn string) (config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err
		}
		return config{}, fmt.Errorf("file: malformed URL: %w: %w", driver.ErrInvalid, err)
	}
	if !strings.EqualFold(u.Scheme, "file") {
		return config{}, fmt.Errorf("file: %w: URL scheme %q, want file", driver.ErrInvalid, u.Scheme)
	}
	if u.Opaque != "" {
		return config{}, fmt.Errorf("file: %w: relative path %q, want file:///absolute/dir or file://", driver.ErrInvalid, u.Opaque)
	}
	if u.User != nil {
		return config{}, fmt.Errorf("file: %w: URL has user information, which a file URL cannot use", driver.ErrInvalid)
	}
	if h := u.Host; h != "" && !strings.EqualFold(h, "localhost") {
		return config{}, fmt.Errorf("file: %w: host %q, want none or localhost (file locks are local to one host)", driver.ErrInvalid, h)
	}
	if u.Fragment != "" {
		return config{}, fmt.Errorf("file: %w: URL has a fragment", driver.ErrInvalid)
	}
	c := config{perm: DefaultPerm}
	switch p := u.Path; {
	case p == "":
		c.dir, c.defaultDir = DefaultDir(), true
	case !strings.HasPrefix(p, "/"):
		return config{}, fmt.Errorf("file: %w: path %q is not absolute", driver.ErrInvalid, p)
	default:
		c.dir = filepath.Clean(p)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return config{}, fmt.Errorf("file: %w: malformed query: %w", driver.ErrInvalid, err)
	}
	for name, vals := range q {
		if len(vals) != 1 {
			return config{}, fmt.Errorf("file: %w: query parameter %q given %d times", driver.ErrInvalid, name, len(vals))
		}
		v := vals[0]
		switch name {
		case "perm":
			n, err := strconv.ParseUint(v, 8, 32)
			if err != nil || n&^0o666 != 0 || n&0o600 != 0o600 {
				return config{}, fmt.Errorf("file: %w: perm=%q: want octal permission bits between 0600 and 0666", driver.ErrInvalid, v)
			}
			c.perm = os.FileMode(n)
		default:
			return config{}, fmt.Errorf("file: %w: unknown query parameter %q (known: perm)", driver.ErrInvalid, name)
		}
	}
	return c, nil
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
