package file

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// A shared record is the content of a semaphore's or read-write lock's
// file: its holders, each with its own lease, and its queue of waiting
// requests. The file holds a header line and one line per holder and per
// waiter:
//
//	s1 <boot id> <floor token> <holders> <waiters> <quoted key>
//	h <token> <mode> <expires> <waiter id or -> <quoted owner>
//	q <waiter id> <mode> <limit> <ttl ns> <quoted owner>
//
// mode is p (permit), r (read) or w (write); expires is on CLOCK_MONOTONIC
// of the boot named in the header, as for a lease; floor is the highest
// token ever granted on the file. The counts in the header say how many
// lines follow, so that bytes left past them (a writer killed between its
// write and its truncate) are ignored. A holder line names the waiter it
// was granted to, so that a waiter that gives up undoes its own grant and
// no other.
type sharedRec struct {
	boot    string
	floor   uint64
	key     string
	holders []sharedHolder // in token order
	queue   []sharedEntry  // in arrival order
}

type sharedHolder struct {
	token   uint64
	mode    driver.SharedMode
	expires int64  // CLOCK_MONOTONIC ns of rec.boot
	via     string // id of the waiter it was granted to, "" if granted at once
	owner   string
}

// A sharedEntry is a waiting request. Its waiter holds an exclusive flock
// on its waiter file while it waits: an entry whose file is unlocked or
// gone belongs to a process that died, and is dropped.
type sharedEntry struct {
	id    string
	mode  driver.SharedMode
	limit int
	ttl   time.Duration
	owner string
}

const sharedVersion = "s1"

// sharedFileName is the file of the semaphore (rw false) or read-write lock
// (rw true) on key: the hash of the key, as for its mutex, with its own
// suffix, so that the three locks on one key string never share a file.
func sharedFileName(key string, rw bool) string {
	sum := sha256.Sum256([]byte(key))
	ext := ".sem"
	if rw {
		ext = ".rw"
	}
	return hex.EncodeToString(sum[:20]) + ext
}

// waiterFileName is the file a waiter on the lock in file name holds
// flocked while it waits.
func waiterFileName(name, id string) string { return name + "." + id + ".wait" }

func modeChar(m driver.SharedMode) byte {
	switch m {
	case driver.SharedRead:
		return 'r'
	case driver.SharedWrite:
		return 'w'
	}
	return 'p'
}

func charMode(s string) driver.SharedMode {
	switch s {
	case "p":
		return driver.SharedPermit
	case "r":
		return driver.SharedRead
	case "w":
		return driver.SharedWrite
	}
	return 0
}

func (r *sharedRec) encode(b []byte) []byte {
	b = append(b, sharedVersion+" "...)
	b = append(b, r.boot...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, r.floor, 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(r.holders)), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(r.queue)), 10)
	b = append(b, ' ')
	b = strconv.AppendQuote(b, r.key)
	b = append(b, '\n')
	for _, h := range r.holders {
		b = append(b, "h "...)
		b = strconv.AppendUint(b, h.token, 10)
		b = append(b, ' ', modeChar(h.mode), ' ')
		b = strconv.AppendInt(b, h.expires, 10)
		b = append(b, ' ')
		if h.via == "" {
			b = append(b, '-')
		}
		b = append(b, h.via...)
		b = append(b, ' ')
		b = strconv.AppendQuote(b, h.owner)
		b = append(b, '\n')
	}
	for _, e := range r.queue {
		b = append(b, "q "...)
		b = append(b, e.id...)
		b = append(b, ' ', modeChar(e.mode), ' ')
		b = strconv.AppendInt(b, int64(e.limit), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(e.ttl), 10)
		b = append(b, ' ')
		b = strconv.AppendQuote(b, e.owner)
		b = append(b, '\n')
	}
	return b
}

// fields splits the first n space-separated fields off line and returns
// them with the rest, a quoted string.
func fields(line string, n int) ([]string, string, bool) {
	out := make([]string, n)
	for i := range out {
		var ok bool
		if out[i], line, ok = strings.Cut(line, " "); !ok || out[i] == "" {
			return nil, "", false
		}
	}
	s, err := strconv.Unquote(line)
	return out, s, err == nil
}

var errBadRecord = errors.New("malformed shared record")

// decodeShared parses a shared record. An empty b is an empty record; a
// malformed one is errBadRecord.
func decodeShared(b []byte) (r sharedRec, err error) {
	if len(b) == 0 {
		return r, nil
	}
	s := string(b)
	line, s, ok := strings.Cut(s, "\n")
	if !ok {
		return r, errBadRecord
	}
	f, key, ok := fields(line, 5)
	if !ok || f[0] != sharedVersion {
		return r, errBadRecord
	}
	r.boot, r.key = f[1], key
	var nh, nq int
	if r.floor, err = strconv.ParseUint(f[2], 10, 64); err != nil {
		return r, errBadRecord
	}
	if nh, err = strconv.Atoi(f[3]); err != nil || nh < 0 {
		return r, errBadRecord
	}
	if nq, err = strconv.Atoi(f[4]); err != nil || nq < 0 {
		return r, errBadRecord
	}
	for i := 0; i < nh+nq; i++ {
		if line, s, ok = strings.Cut(s, "\n"); !ok {
			return r, errBadRecord
		}
		if i < nh {
			h, ok := decodeHolder(line)
			if !ok {
				return r, errBadRecord
			}
			r.holders = append(r.holders, h)
		} else {
			e, ok := decodeEntry(line)
			if !ok {
				return r, errBadRecord
			}
			r.queue = append(r.queue, e)
		}
	}
	return r, nil
}

func decodeHolder(line string) (h sharedHolder, ok bool) {
	f, owner, ok := fields(line, 5)
	if !ok || f[0] != "h" {
		return h, false
	}
	var err1, err2 error
	h.token, err1 = strconv.ParseUint(f[1], 10, 64)
	h.mode = charMode(f[2])
	h.expires, err2 = strconv.ParseInt(f[3], 10, 64)
	if h.via = f[4]; h.via == "-" {
		h.via = ""
	}
	h.owner = owner
	return h, err1 == nil && err2 == nil && h.mode.Valid()
}

func decodeEntry(line string) (e sharedEntry, ok bool) {
	f, owner, ok := fields(line, 5)
	if !ok || f[0] != "q" {
		return e, false
	}
	var err1, err2 error
	e.id = f[1]
	e.mode = charMode(f[2])
	e.limit, err1 = strconv.Atoi(f[3])
	var ttl int64
	ttl, err2 = strconv.ParseInt(f[4], 10, 64)
	e.ttl, e.owner = time.Duration(ttl), owner
	return e, err1 == nil && err2 == nil && e.mode.Valid()
}

// readShared reads the record in fd. A malformed record reads as empty: it
// grants nothing and the key's next grant rewrites it (the token counter
// still floors that grant's token).
func readShared(fd int, buf []byte) (sharedRec, []byte, error) {
	b, err := readAll(fd, buf)
	if err != nil {
		return sharedRec{}, b, fmt.Errorf("file: read lock file: %w", err)
	}
	r, err := decodeShared(b)
	if err != nil {
		return sharedRec{}, b, nil
	}
	return r, b, nil
}

// writeShared replaces the record in fd.
func writeShared(fd int, r *sharedRec, buf []byte) error {
	if err := writeAt(fd, r.encode(buf[:0])); err != nil {
		return fmt.Errorf("file: write lock file: %w", err)
	}
	return nil
}

// holder returns the index of owner's hold, or -1.
func (r *sharedRec) holder(owner string) int {
	for i := range r.holders {
		if r.holders[i].owner == owner {
			return i
		}
	}
	return -1
}

// entry returns the index of the waiter id in the queue, or -1.
func (r *sharedRec) entry(id string) int {
	for i := range r.queue {
		if r.queue[i].id == id {
			return i
		}
	}
	return -1
}

// fits reports whether a request in mode with limit can be granted beside
// the holders.
func (r *sharedRec) fits(mode driver.SharedMode, limit int) bool {
	switch mode {
	case driver.SharedPermit:
		return len(r.holders) < limit
	case driver.SharedRead:
		for _, h := range r.holders {
			if h.mode == driver.SharedWrite {
				return false
			}
		}
		return true
	}
	return len(r.holders) == 0
}

// expire drops the holders whose lease ended by at, and, if the record was
// written during another boot, its waiters too (their processes are gone).
// It reports whether it dropped any.
func (r *sharedRec) expire(at instant) bool {
	if r.boot != at.boot {
		changed := len(r.holders)+len(r.queue) > 0
		r.boot, r.holders, r.queue = at.boot, nil, nil
		return changed
	}
	n := len(r.holders)
	keep := r.holders[:0]
	for _, h := range r.holders {
		if h.expires > at.mono {
			keep = append(keep, h)
		}
	}
	r.holders = keep
	return len(keep) != n
}

// remaining is the time left of h at at.
func (r *sharedRec) remaining(h *sharedHolder, at instant) time.Duration {
	if r.boot != at.boot {
		return 0
	}
	return time.Duration(h.expires - at.mono)
}

// nextExpiry is the time until the first holder's lease ends, or 0 if
// there is no holder.
func (r *sharedRec) nextExpiry(at instant) time.Duration {
	var d time.Duration
	for i := range r.holders {
		if rem := r.remaining(&r.holders[i], at); d == 0 || rem < d {
			d = max(rem, time.Microsecond)
		}
	}
	return d
}

// soonest is the *driver.HeldError of a request that does not fit now: the
// remaining TTL of the holder whose lease ends first, if any.
func (r *sharedRec) soonest(at instant) error {
	if len(r.holders) == 0 {
		return fmt.Errorf("file: %w (requests are queued)", driver.ErrNotAcquired)
	}
	return &driver.HeldError{Remaining: r.nextExpiry(at)}
}

// waiterAlive reports whether the waiter of entry id on the lock in file
// name still waits: its waiter file is there and flocked. A dead waiter's
// file is removed.
func (l *Locker) waiterAlive(name, id string) bool {
	path := l.dir + "/" + waiterFileName(name, id)
	// Write-only: closing it must not look like the end of the waiter,
	// whose own descriptor is read-only (see newWaiter).
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return false
	}
	if err != nil {
		return true // cannot tell: keep it
	}
	defer unix.Close(fd)
	flocks.Add(1)
	err = unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		_ = unix.Unlink(path)
		return false
	}
	return true
}
