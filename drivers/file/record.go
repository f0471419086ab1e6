package file

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// A lease is the record kept in a key's lock file: who holds the key, until
// when and with which fencing token. The file holds one line:
//
//	2 <token> <boot id> <expires> <quoted owner> <quoted key>
//
// so that `cat` shows who holds what. expires is on CLOCK_MONOTONIC of the
// boot named by the boot id (/proc/sys/kernel/random/boot_id): a clock that
// wall-clock steps do not move, and that stands still while the host is
// suspended, as the holders' own deadlines (Go's monotonic clock) do. A
// record from another boot has expired. A released key keeps its record
// with an empty owner: its token is the floor of the key's next one.
//
// Version 1 records (expires in Unix nanoseconds on the wall clock, no boot
// id), written by earlier versions, are still read and honoured on the wall
// clock until rewritten; earlier versions cannot read version 2, so all
// processes sharing a directory must run this version or a later one.
type lease struct {
	token   uint64
	boot    string // boot id; "" for a version 1 record
	expires int64  // CLOCK_MONOTONIC ns of that boot; version 1: Unix ns
	owner   string // "" once released
	key     string
}

const (
	leaseVersion   = "2"
	leaseVersionV1 = "1"
)

// instant is the time now on the clocks records use.
type instant struct {
	boot string // this boot's id
	mono int64  // CLOCK_MONOTONIC, ns
	wall int64  // Unix ns, for version 1 records only
}

// bootID is this boot's id, read once.
var bootID = sync.OnceValues(func() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("file: boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" || strings.ContainsAny(id, " \t\n") {
		return "", fmt.Errorf("file: boot id %q is malformed", id)
	}
	return id, nil
})

// monoNow reads CLOCK_MONOTONIC, the clock Go's timers and package locker's
// safe deadlines run on.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic("file: CLOCK_MONOTONIC: " + err.Error()) // cannot fail on Linux
	}
	return ts.Nano()
}

// now returns the current instant. boot is this boot's id, from bootID.
func now(boot string) instant {
	return instant{boot: boot, mono: monoNow(), wall: wallClock().UnixNano()}
}

// encode appends the record line to b.
func (r *lease) encode(b []byte) []byte {
	b = append(b, leaseVersion...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.token, 10)
	b = append(b, ' ')
	b = append(b, r.boot...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, r.expires, 10)
	b = append(b, ' ')
	b = strconv.AppendQuote(b, r.owner)
	b = append(b, ' ')
	b = strconv.AppendQuote(b, r.key)
	return append(b, '\n')
}

// decode parses a record line; ok is false for an empty or unreadable
// record, which counts as no lease.
func decode(b []byte) (r lease, ok bool) {
	s := string(b)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	} else {
		return r, false // a record always ends in a newline
	}
	ver, s, _ := strings.Cut(s, " ")
	if ver != leaseVersion && ver != leaseVersionV1 {
		return r, false
	}
	tok, s, _ := strings.Cut(s, " ")
	if ver == leaseVersion {
		if r.boot, s, _ = strings.Cut(s, " "); r.boot == "" {
			return r, false
		}
	}
	exp, s, _ := strings.Cut(s, " ")
	var err error
	if r.token, err = strconv.ParseUint(tok, 10, 64); err != nil {
		return r, false
	}
	if r.expires, err = strconv.ParseInt(exp, 10, 64); err != nil {
		return r, false
	}
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return r, false
	}
	if r.owner, err = strconv.Unquote(q); err != nil {
		return r, false
	}
	s = strings.TrimPrefix(s[len(q):], " ")
	if r.key, err = strconv.Unquote(s); err != nil {
		return r, false
	}
	return r, true
}

// held reports whether the lease is in force at now.
func (r *lease) held(now instant) bool { return r.owner != "" && r.remaining(now) > 0 }

// remaining is the lease's time left at now: zero or less once expired,
// and for a record of another boot.
func (r *lease) remaining(now instant) time.Duration {
	switch r.boot {
	case "":
		return time.Duration(r.expires - now.wall)
	case now.boot:
		return time.Duration(r.expires - now.mono)
	}
	return 0
}

// grant makes r a lease for owner, expiring ttl after now.
func (r *lease) grant(owner string, now instant, ttl time.Duration) {
	r.owner, r.boot, r.expires = owner, now.boot, now.mono+int64(ttl)
}

// fileName is the lock file name of key: a hash, so that any key, whatever
// its length or bytes, maps to a short portable name. The key itself is
// stored in the record and checked on every read.
func fileName(key string) string {
	var b [fileNameLen]byte
	putFileName(&b, key)
	return string(b[:])
}

// fileNameLen is the length of every lock file name.
const fileNameLen = 44

// putFileName writes fileName(key) into b.
func putFileName(b *[fileNameLen]byte, key string) {
	sum := sha256.Sum256([]byte(key))
	hex.Encode(b[:40], sum[:20])
	copy(b[40:], ".lck")
}

// flocks counts the flock attempts of every Locker in the process: the
// file driver's calls on the shared state, which its contention benchmark
// reports per acquisition.
var flocks atomic.Int64

// flockFile opens path and takes an flock of kind how (unix.LOCK_EX or
// unix.LOCK_SH) on it, waiting as ctx allows. It polls with a non-blocking
// flock and a short capped backoff, so that a holder of the flock that is
// stopped (SIGSTOP, a debugger) never blocks a caller past its ctx; the
// flock itself is held only for the few system calls of one operation.
//
// Since releases unlink lock files, the locked file is checked to still be
// the one at path; if it was unlinked meanwhile, the open is retried. With
// create false a missing file returns unix.ENOENT.
func flockFile(ctx context.Context, path string, how int, create bool, perm uint32) (int, error) {
	flags := unix.O_RDWR | unix.O_CLOEXEC
	if create {
		flags |= unix.O_CREAT
	}
	var wait time.Duration
	for {
		fd, err := unix.Open(path, flags, perm)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return -1, err
		}
		for {
			flocks.Add(1)
			err = unix.Flock(fd, how|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
				break
			}
			if cerr := ctx.Err(); cerr != nil {
				unix.Close(fd)
				return -1, cerr
			}
			wait = backoff(wait)
			if cerr := sleepCtx(ctx, wait); cerr != nil {
				unix.Close(fd)
				return -1, cerr
			}
		}
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		var fst, pst unix.Stat_t
		if err := unix.Fstat(fd, &fst); err != nil {
			unix.Close(fd)
			return -1, err
		}
		err = unix.Stat(path, &pst)
		if err == nil && fst.Dev == pst.Dev && fst.Ino == pst.Ino {
			return fd, nil
		}
		unix.Close(fd)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return -1, err
		}
		if !create && errors.Is(err, unix.ENOENT) {
			return -1, unix.ENOENT
		}
		// Unlinked (and maybe recreated) under us: open again.
	}
}

// backoff returns the next poll interval: 20µs doubling to 2ms.
func backoff(d time.Duration) time.Duration {
	switch {
	case d < 20*time.Microsecond:
		return 20 * time.Microsecond
	case d >= time.Millisecond:
		return 2 * time.Millisecond
	default:
		return 2 * d
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// readAll reads the whole small file fd into buf (grown as needed).
func readAll(fd int, buf []byte) ([]byte, error) {
	buf = buf[:0]
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(fd, buf[len(buf):cap(buf)], int64(len(buf)))
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return buf, err
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// readLease reads the record in fd. ok is false if the file holds none.
func readLease(fd int) (r lease, ok bool, err error) {
	var arr [256]byte
	b, err := readAll(fd, arr[:0])
	if err != nil {
		return r, false, fmt.Errorf("file: read lock file: %w", err)
	}
	r, ok = decode(b)
	return r, ok, nil
}

// writeLease replaces the record in fd.
func writeLease(fd int, r *lease) error {
	var arr [256]byte
	b := r.encode(arr[:0])
	if err := writeAt(fd, b); err != nil {
		return fmt.Errorf("file: write lock file: %w", err)
	}
	return nil
}

// writeAt writes b at offset 0 and truncates the file to len(b).
func writeAt(fd int, b []byte) error {
	for off := 0; off < len(b); {
		n, err := unix.Pwrite(fd, b[off:], int64(off))
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		off += n
	}
	for {
		err := unix.Ftruncate(fd, int64(len(b)))
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}
