package file

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// tokenFile is the name of the per-directory fencing token counter. Lock
// files are named by hash with a .lck suffix, so it cannot clash with one.
const tokenFile = "tokens"

// wallStep is added to the wall clock (nanoseconds): tests step the clock
// with it, without touching the host's.
var wallStep atomic.Int64

// wallClock is the wall clock tokens are floored at (and version 1 records
// expire on).
func wallClock() time.Time { return time.Now().Add(time.Duration(wallStep.Load())) }

// nextToken bumps the directory's token counter under its flock and returns
// the new value: max(counter+1, floor+1, wall clock in microseconds), where
// floor is the last token recorded for the key. The counter makes tokens
// strictly increasing even if the clock steps back; the key's record keeps
// them increasing for the key if the counter file is lost and the clock
// stepped back; and the clock keeps them increasing if the whole directory
// is lost (a tmpfs cleared at reboot), as long as grants averaged fewer than
// one per microsecond, which the system calls of a grant guarantee.
func (l *Locker) nextToken(ctx context.Context, floor uint64) (uint64, error) {
	fd, err := flockFile(ctx, l.tokenPath, unix.LOCK_EX, true, l.perm)
	if err != nil {
		return 0, fmt.Errorf("file: token counter: %w", err)
	}
	defer unix.Close(fd)
	var arr [32]byte
	b, err := readAll(fd, arr[:0])
	if err != nil {
		return 0, fmt.Errorf("file: read token counter: %w", err)
	}
	var cur uint64
	if n := len(b); n > 0 && b[n-1] == '\n' {
		cur, _ = strconv.ParseUint(string(b[:n-1]), 10, 64) // unreadable: start from the clock
	}
	next := max(uint64(max(wallClock().UnixMicro(), 0)), cur+1, floor+1)
	b = strconv.AppendUint(arr[:0], next, 10)
	b = append(b, '\n')
	if err := writeAt(fd, b); err != nil {
		return 0, fmt.Errorf("file: write token counter: %w", err)
	}
	return next, nil
}
