package file

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// Benchmarks: one uncontended acquire+release through the driver, through
// package locker, and as the raw system calls the driver makes (the
// floor): open+flock+read+write of the lock file, the token counter bump,
// and open+flock+read+write to release.
//
//	go test -run '^$' -bench . -benchmem ./drivers/file

func BenchmarkAcquireRelease(b *testing.B) {
	l, err := Open(context.Background(), "file://"+b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	benchMutex(l)(b)
}

// BenchmarkAcquireReleaseWatched is BenchmarkAcquireRelease while the
// directory is watched (a subscription to another key keeps the Locker's
// inotify watch on): what the watch adds to every write in the directory.
func BenchmarkAcquireReleaseWatched(b *testing.B) {
	l, err := Open(context.Background(), "file://"+b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	s, err := l.newSubscription("other")
	if err != nil {
		b.Fatal(err)
	}
	if s.w == nil {
		b.Fatal("inotify is not available: the directory is not watched")
	}
	defer s.stop(false)
	benchMutex(l)(b)
}

// benchMutex is one uncontended Acquire+Release per iteration.
func benchMutex(l *Locker) func(*testing.B) {
	return func(b *testing.B) {
		ctx := context.Background()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.Acquire(ctx, "bench", "owner", time.Minute); err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, "bench", "owner"); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkLockerAcquireRelease(b *testing.B) {
	l, err := locker.OpenURL("file://" + b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lk, err := l.TryAcquire(ctx, "bench", locker.WithTTL(time.Minute))
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRawSyscalls(b *testing.B) {
	dir := b.TempDir()
	path := filepath.Join(dir, fileName("bench"))
	tokens := filepath.Join(dir, tokenFile)
	buf := make([]byte, 256)
	record := []byte("2 1764432000000000 91b54395-00d1-4045-9804-259d6cb0c25a 60000000000 \"owner\" \"bench\"\n")
	free := []byte("2 1764432000000000 91b54395-00d1-4045-9804-259d6cb0c25a 0 \"\" \"bench\"\n")
	lockedOpen := func(p string, flags int) int {
		fd, err := unix.Open(p, flags|unix.O_CLOEXEC, 0o600)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			b.Fatal(err)
		}
		var st1, st2 unix.Stat_t
		_ = unix.Fstat(fd, &st1)
		_ = unix.Stat(p, &st2)
		return fd
	}
	b.ReportAllocs()
	var tok uint64
	for b.Loop() {
		fd := lockedOpen(path, unix.O_RDWR|unix.O_CREAT)
		_, _ = unix.Pread(fd, buf, 0)
		tf := lockedOpen(tokens, unix.O_RDWR|unix.O_CREAT)
		_, _ = unix.Pread(tf, buf, 0)
		tok++
		_, _ = unix.Pwrite(tf, strconv.AppendUint(buf[:0], tok, 10), 0)
		_ = unix.Ftruncate(tf, 20)
		unix.Close(tf)
		_, _ = unix.Pwrite(fd, record, 0)
		_ = unix.Ftruncate(fd, int64(len(record)))
		unix.Close(fd)

		fd = lockedOpen(path, unix.O_RDWR)
		_, _ = unix.Pread(fd, buf, 0)
		_, _ = unix.Pwrite(fd, free, 0)
		_ = unix.Ftruncate(fd, int64(len(free)))
		unix.Close(fd)
	}
}

// BenchmarkRefresh is one renewal of a held lock.
func BenchmarkRefresh(b *testing.B) {
	l, err := Open(context.Background(), "file://"+b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Acquire(ctx, "bench", "owner", time.Minute); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Refresh(ctx, "bench", "owner", time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandoff measures a release in one Locker waking a waiter in
// another, which then takes the lock: the time per handoff.
func BenchmarkHandoff(b *testing.B) {
	dir := b.TempDir()
	la, err := locker.OpenURL("file://" + dir)
	if err != nil {
		b.Fatal(err)
	}
	defer la.Close()
	lb, err := locker.OpenURL("file://" + dir)
	if err != nil {
		b.Fatal(err)
	}
	defer lb.Close()
	ctx := context.Background()
	held, err := la.Acquire(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	lockers := [2]*locker.Locker{la, lb}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		next := make(chan *locker.Lock)
		go func(l *locker.Locker) {
			lk, err := l.Acquire(ctx, "bench")
			if err != nil {
				panic(err)
			}
			next <- lk
		}(lockers[(i+1)%2])
		if err := held.Release(ctx); err != nil {
			b.Fatal(err)
		}
		held = <-next
		i++
	}
	_ = held.Release(ctx)
}

// BenchmarkSharedAcquireRelease is one uncontended acquire+release of a
// semaphore permit and of a read hold, beside the mutex's (Mutex, the
// floor), interleaved in one run.
func BenchmarkSharedAcquireRelease(b *testing.B) {
	l, err := Open(context.Background(), "file://"+b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	shared := func(mode driver.SharedMode) func(*testing.B) {
		return func(b *testing.B) {
			r := driver.SharedRequest{Mode: mode, Owner: "owner", TTL: time.Minute, Limit: 8}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := l.AcquireShared(ctx, "bench", r); err != nil {
					b.Fatal(err)
				}
				if err := l.ReleaseShared(ctx, "bench", mode, "owner"); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("Mutex", benchMutex(l))
	b.Run("Semaphore", shared(driver.SharedPermit))
	b.Run("Read", shared(driver.SharedRead))
}
