package file

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A lease is the record kept in a key's lock file: who holds the key, until
// when (wall clock, Unix nanoseconds) and with which fencing token. The file
// holds one line:
//
//	1 <token> <expires-unix-nanos> <quoted owner> <quoted key>
//
// so that `cat` shows who holds what.
type lease struct {
	token   uint64
	expires int64
	owner   string
	key     string
}

const leaseVersion = "1"

// encode appends the record line to b.
func (r *lease) encode(b []byte) []byte {
	b = append(b, leaseVersion...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.token, 10)
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
	if ver != leaseVersion {
		return r, false
	}
	tok, s, _ := strings.Cut(s, " ")
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

// held reports whether the lease is in force at now (Unix nanoseconds).
func (r *lease) held(now int64) bool { return r.owner != "" && r.expires > now }

// fileName is the lock file name of key: a hash, so that any key, whatever
// its length or bytes, maps to a short portable name. The key itself is
// stored in the record and checked on every read.
func fileName(key string) string {
	sum := sha256.Sum256([]byte(key))
	var b [44]byte
	hex.Encode(b[:40], sum[:20])
	copy(b[40:], ".lck")
	return string(b[:])
}

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
