package etcd

import (
	"context"
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/contendtest"
)

// BenchmarkContention: 8, 32 and 64 Lockers, each on its own client as
// separate processes would be, contend for a mutex (mutex-N) and for the
// permits of a semaphore of 4 (sem4-N); see contendtest.Bench. calls/acq
// counts the unary requests and stream messages the clients send. Run with
// a fixed count, e.g. -benchtime 400x.
func BenchmarkContention(b *testing.B) {
	var c counter
	contendtest.Bench(b, "", func(b *testing.B, procs int) []*locker.Locker {
		pfx := "/contention-" + randHex(4)
		ls := make([]*locker.Locker, procs)
		for i := range ls {
			d, err := New(context.Background(), c.client(b), &Options{Prefix: pfx})
			if err != nil {
				b.Fatal(err)
			}
			ls[i] = locker.New(d)
			b.Cleanup(func() { _ = ls[i].Close() })
		}
		return ls
	}, c.n.Load)
}
