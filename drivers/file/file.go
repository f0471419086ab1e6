package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/dsn"
	"golang.org/x/sys/unix"
)

func init() { locker.Register("file", Driver{}) }

// Driver opens file lockers. It is registered with package locker under the
// name and URL scheme "file".
type Driver struct{}

// Open calls the package-level Open with context.Background().
func (Driver) Open(dsn string) (driver.Locker, error) { return Open(context.Background(), dsn) }

// Limits on what Acquire accepts; longer values fail with driver.ErrInvalid.
const (
	// MaxKeyLen is the longest key accepted, in bytes.
	MaxKeyLen = 64 << 10
	// MaxOwnerLen is the longest owner string accepted, in bytes.
	MaxOwnerLen = 1024
)

// Locker keeps leases in lock files in one directory. It implements
// driver.Locker, driver.Waiter, driver.HoldWatcher, driver.Inspector,
// driver.SharedLocker, driver.Capable and driver.Pinger, and is safe for
// concurrent use. Lockers opened on the same
// directory, in one process or many, exclude each other.
type Locker struct {
	dir       string
	tokenPath string
	perm      uint32
	boot      string // this boot's id
	closed    atomic.Bool

	mu   sync.Mutex
	subs map[*subscription]struct{}
}

var (
	_ driver.Locker    = (*Locker)(nil)
	_ driver.Waiter    = (*Locker)(nil)
	_ driver.Inspector = (*Locker)(nil)
	_ driver.Capable   = (*Locker)(nil)
	_ driver.Pinger    = (*Locker)(nil)
)

// Open returns a Locker for dsn, "file://" (the DefaultDir) or
// "file:///absolute/dir", with the optional query parameter perm (see the
// package documentation). It creates the directory if it is missing. ctx
// bounds Open only: an Open whose ctx is already done returns ctx.Err()
// (wrapped).
//
// Errors: a malformed URL or an unknown or bad parameter wraps
// driver.ErrInvalid; a directory that cannot be created or written, or a
// default directory that another user owns or can write, fails with the
// file system's error.
func Open(ctx context.Context, dsn string) (*Locker, error) {
	c, err := parseDSN(dsn)
	if err != nil {
		return nil, err
	}
	return openDir(ctx, c)
}

// Options configures New. A nil *Options, and the zero value, mean every
// default.
type Options struct {
	// Perm is the permission of lock files, and of the directory if New
	// creates it (plus the matching search bits): between 0600 and 0666.
	// Zero means DefaultPerm (0600).
	Perm os.FileMode
}

// New returns a Locker that keeps its lock files in dir, an absolute path,
// or in DefaultDir() if dir is empty, creating the directory if it is
// missing; New(ctx, "/var/lock/app", nil) is Open(ctx,
// "file:///var/lock/app"). ctx bounds New only, as for Open.
//
// Errors: a relative dir or a Perm out of range wraps driver.ErrInvalid;
// otherwise as for Open.
func New(ctx context.Context, dir string, opts *Options) (*Locker, error) {
	c := config{dir: dir, perm: DefaultPerm}
	switch {
	case dir == "":
		c.dir, c.defaultDir = DefaultDir(), true
	case !filepath.IsAbs(dir):
		return nil, dsn.Invalid("file", "directory %q is not an absolute path", dir)
	default:
		c.dir = filepath.Clean(dir)
	}
	if opts != nil && opts.Perm != 0 {
		if opts.Perm&^0o666 != 0 || opts.Perm&0o600 != 0o600 {
			return nil, dsn.Invalid("file", "Perm %#o: want permission bits between 0600 and 0666", uint32(opts.Perm))
		}
		c.perm = opts.Perm
	}
	return openDir(ctx, c)
}

// openDir opens a Locker on the directory c names, creating it if needed.
func openDir(ctx context.Context, c config) (*Locker, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	boot, err := bootID()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.dir, dirPerm(c.perm)); err != nil {
		return nil, fmt.Errorf("file: lock directory: %w", err)
	}
	if c.defaultDir {
		if err := checkPrivateDir(c.dir); err != nil {
			return nil, err
		}
	}
	l := &Locker{
		dir:       c.dir,
		tokenPath: filepath.Join(c.dir, tokenFile),
		perm:      uint32(c.perm),
		boot:      boot,
		subs:      map[*subscription]struct{}{},
	}
	fd, err := unix.Open(l.tokenPath, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, l.perm)
	if err != nil {
		return nil, fmt.Errorf("file: lock directory %s is not writable: %w", c.dir, err)
	}
	unix.Close(fd)
	return l, nil
}

// checkPrivateDir refuses a default directory in a shared temporary
// directory that someone else could have planted or can write to.
func checkPrivateDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("file: lock directory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("file: lock directory %s is not a directory", dir)
	}
	if int(st.Uid) != os.Getuid() {
		return fmt.Errorf("file: lock directory %s belongs to uid %d, not to this user (uid %d)", dir, st.Uid, os.Getuid())
	}
	if st.Mode&0o022 != 0 {
		return fmt.Errorf("file: lock directory %s is writable by other users (mode %o)", dir, st.Mode&0o777)
	}
	return nil
}

// Dir returns the directory the Locker keeps its lock files in.
func (l *Locker) Dir() string { return l.dir }

// Path returns the lock file of key: Dir()/<hash of key>.lck.
func (l *Locker) Path(key string) string {
	p, _ := l.pathName(key)
	return p
}

// pathName returns Path(key) and fileName(key), a suffix of it, built in
// one allocation.
func (l *Locker) pathName(key string) (path, name string) {
	var n [fileNameLen]byte
	putFileName(&n, key)
	if l.dir == "." || strings.HasSuffix(l.dir, "/") {
		path = filepath.Join(l.dir, string(n[:])) // Join drops "./" and doubles no "/"
	} else {
		var b strings.Builder
		b.Grow(len(l.dir) + 1 + fileNameLen)
		b.WriteString(l.dir)
		b.WriteByte('/')
		b.Write(n[:])
		path = b.String()
	}
	return path, path[len(path)-fileNameLen:]
}

// Capabilities reports that any positive TTL is kept exactly (expiry is
// compared on the host's monotonic clock) and that tokens survive the loss
// of the directory's contents (they are floored at the wall clock in
// microseconds).
func (l *Locker) Capabilities() driver.Capabilities {
	return driver.Capabilities{DurableTokens: true, MaxOwner: MaxOwnerLen}
}

func (l *Locker) check(ctx context.Context, key, owner string, ttl time.Duration, needTTL bool) error {
	switch {
	case key == "":
		return fmt.Errorf("file: %w: empty key", driver.ErrInvalid)
	case len(key) > MaxKeyLen:
		return fmt.Errorf("file: %w: key is %d bytes, the limit is %d", driver.ErrInvalid, len(key), MaxKeyLen)
	case owner == "":
		return fmt.Errorf("file: %w: empty owner", driver.ErrInvalid)
	case len(owner) > MaxOwnerLen:
		return fmt.Errorf("file: %w: owner is %d bytes, the limit is %d", driver.ErrInvalid, len(owner), MaxOwnerLen)
	case needTTL && ttl <= 0:
		return fmt.Errorf("file: %w: ttl must be positive, got %v", driver.ErrInvalid, ttl)
	}
	if l.closed.Load() {
		return driver.ErrClosed
	}
	return ctxErr(ctx)
}

func ctxErr(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

// lockErr turns an error of flockFile into the driver's.
func lockErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && errors.Is(err, cerr) {
		return fmt.Errorf("file: %w", cerr)
	}
	return fmt.Errorf("file: lock file: %w", err)
}

// Acquire takes key for owner for ttl in one read-modify-write of the key's
// lock file under flock. It returns a *driver.HeldError (wrapping
// driver.ErrNotAcquired) with the holder's remaining TTL if another owner
// holds key, and the current token, with the TTL reset, if owner does.
// A ctx that ends first returns an error wrapping ctx.Err() and grants
// nothing. Bad arguments wrap driver.ErrInvalid; after Close,
// driver.ErrClosed.
func (l *Locker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := l.check(ctx, key, owner, ttl, true); err != nil {
		return 0, err
	}
	path := l.Path(key)
	fd, err := flockFile(ctx, path, unix.LOCK_EX, true, l.perm)
	if err != nil {
		return 0, lockErr(ctx, err)
	}
	defer unix.Close(fd)
	r, ok, err := readLease(fd)
	if err != nil {
		return 0, err
	}
	if ok && r.held(now(l.boot)) {
		if r.key != key {
			return 0, fmt.Errorf("file: key %q collides with key %q in %s", key, r.key, path)
		}
		if r.owner != owner {
			return 0, &driver.HeldError{Remaining: r.remaining(now(l.boot))}
		}
		r.grant(owner, now(l.boot), ttl)
		if err := writeLease(fd, &r); err != nil {
			return 0, err
		}
		return r.token, nil
	}
	fail := func(err error) (uint64, error) {
		if !ok {
			// Leave no empty file behind (nobody can see it: we hold the flock).
			_ = unix.Unlink(path)
		}
		return 0, err
	}
	if err := ctxErr(ctx); err != nil {
		return fail(err)
	}
	// The record left by the key's last grant, expired or released, floors
	// the token.
	tok, err := l.nextToken(ctx, r.token)
	if err != nil {
		return fail(lockErr(ctx, err))
	}
	r = lease{token: tok, key: key}
	r.grant(owner, now(l.boot), ttl)
	if err := writeLease(fd, &r); err != nil {
		return fail(err)
	}
	return tok, nil
}

// openHeld locks key's file for a change by owner. It returns
// driver.ErrNotHeld if owner does not hold key.
func (l *Locker) openHeld(ctx context.Context, key, owner string, ttl time.Duration, needTTL bool) (int, lease, error) {
	if err := l.check(ctx, key, owner, ttl, needTTL); err != nil {
		return -1, lease{}, err
	}
	fd, err := flockFile(ctx, l.Path(key), unix.LOCK_EX, false, l.perm)
	if errors.Is(err, unix.ENOENT) {
		return -1, lease{}, driver.ErrNotHeld
	}
	if err != nil {
		return -1, lease{}, lockErr(ctx, err)
	}
	r, ok, err := readLease(fd)
	if err != nil {
		unix.Close(fd)
		return -1, lease{}, err
	}
	if !ok || r.key != key || r.owner != owner || !r.held(now(l.boot)) {
		// An expired record stays: its token floors the key's next one.
		unix.Close(fd)
		return -1, lease{}, driver.ErrNotHeld
	}
	return fd, r, nil
}

// Refresh resets the TTL of the lease owner holds on key. It returns
// driver.ErrNotHeld, changing nothing, if owner does not hold key, including
// when its lease expired (an expired lease is never revived). Errors are
// otherwise those of Acquire.
func (l *Locker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	fd, r, err := l.openHeld(ctx, key, owner, ttl, true)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := ctxErr(ctx); err != nil {
		return err
	}
	r.grant(owner, now(l.boot), ttl)
	return writeLease(fd, &r)
}

// Release frees key if owner holds it, by rewriting its record with no
// owner (which wakes waiters); the record keeps the token, the floor of the
// key's next one. It returns driver.ErrNotHeld, changing nothing,
// otherwise. Errors are otherwise those of Acquire.
func (l *Locker) Release(ctx context.Context, key, owner string) error {
	fd, r, err := l.openHeld(ctx, key, owner, 0, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	r.owner, r.boot, r.expires = "", l.boot, 0
	return writeLease(fd, &r)
}

// Inspect returns the holder of key, its token and remaining TTL, or
// driver.ErrNotHeld if key is free. It changes nothing.
func (l *Locker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := l.check(ctx, key, "-", 0, false); err != nil {
		return driver.Info{}, err
	}
	fd, err := flockFile(ctx, l.Path(key), unix.LOCK_SH, false, l.perm)
	if errors.Is(err, unix.ENOENT) {
		return driver.Info{}, driver.ErrNotHeld
	}
	if err != nil {
		return driver.Info{}, lockErr(ctx, err)
	}
	defer unix.Close(fd)
	r, ok, err := readLease(fd)
	if err != nil {
		return driver.Info{}, err
	}
	at := now(l.boot)
	if !ok || r.key != key || !r.held(at) {
		return driver.Info{}, driver.ErrNotHeld
	}
	return driver.Info{Owner: r.owner, Token: r.token, Remaining: r.remaining(at)}, nil
}

// Ping checks that the lock directory is still there and writable.
func (l *Locker) Ping(ctx context.Context) error {
	if l.closed.Load() {
		return driver.ErrClosed
	}
	if err := ctxErr(ctx); err != nil {
		return err
	}
	if err := unix.Access(l.dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("file: lock directory %s: %w", l.dir, err)
	}
	return nil
}

// Close ends the Locker's subscriptions. Leases it granted stay in force
// until released by another Locker with the same owner, or until they
// expire. Close is idempotent; every call after it returns driver.ErrClosed
// (Close itself returns nil).
func (l *Locker) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.mu.Lock()
	subs := l.subs
	l.subs = nil
	l.mu.Unlock()
	for s := range subs {
		s.stop(true)
	}
	return nil
}
