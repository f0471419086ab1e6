package file

import (
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/contendtest"
)

// BenchmarkContention: 8, 32 and 64 Lockers on one directory, as separate
// processes, contend for a mutex (mutex-N) and for the permits of a
// semaphore of 4 (sem4-N); see contendtest.Bench. calls/acq counts the
// flock attempts on the directory's files. Run with a fixed count, e.g.
// -benchtime 400x.
func BenchmarkContention(b *testing.B) {
	contendtest.Bench(b, "", func(b *testing.B, procs int) []*locker.Locker {
		dir := b.TempDir()
		ls := make([]*locker.Locker, procs)
		for i := range ls {
			l, err := locker.OpenURL("file://" + dir)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			ls[i] = l
		}
		return ls
	}, flocks.Load)
}
