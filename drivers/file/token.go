package file

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// tokenFile is the name of the per-directory fencing token counter. Lock
// files are named by hash with a .lck suffix, so it cannot clash with one.
const tokenFile = "tokens"

// nextToken bumps the directory's token counter under its flock and returns
// the new value: max(counter+1, wall clock in microseconds). The counter
// makes tokens strictly increasing even if the clock steps back; the clock
// floor keeps them increasing if the counter file is lost (a tmpfs cleared at
// reboot, a directory wiped), as long as grants averaged fewer than one per
// microsecond, which the system calls of a grant guarantee.
func (l *Locker) nextToken(ctx context.Context) (uint64, error) {
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
	next := uint64(time.Now().UnixMicro())
	if cur >= next {
		next = cur + 1
	}
	b = strconv.AppendUint(arr[:0], next, 10)
	b = append(b, '\n')
	if err := writeAt(fd, b); err != nil {
		return 0, fmt.Errorf("file: write token counter: %w", err)
	}
	return next, nil
}
