package file

import (
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

func flockBlocking(f *os.File) error { return unix.Flock(int(f.Fd()), unix.LOCK_EX) }

// runtimeYield widens the window between read and write of the counter so
// that an overlap, if the lock allowed one, would lose an increment.
func runtimeYield() {
	for range 10 {
		runtime.Gosched()
	}
}
