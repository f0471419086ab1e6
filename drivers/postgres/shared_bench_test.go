package postgres

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
)

// BenchmarkSharedInterleaved: a semaphore permit's and a read hold's
// acquire+release beside the mutex's, interleaved in one loop on one
// Locker, in each mode; the ratios are the targets (≤ 1.3×).
func BenchmarkSharedInterleaved(b *testing.B) {
	for _, mode := range []string{ModeAdvisory, ModeLease} {
		b.Run(mode, func(b *testing.B) {
			url := modeURL(b, mode)
			ctx := context.Background()
			key := fmt.Sprintf("bench/shared/%d", time.Now().UnixNano())
			l := openT(b, url)
			var tMutex, tPermit, tRead time.Duration
			shared := func(m driver.SharedMode) time.Duration {
				t0 := time.Now()
				if _, err := l.AcquireShared(ctx, key, driver.SharedRequest{Mode: m, Owner: "owner", TTL: 10 * time.Second, Limit: 8}); err != nil {
					b.Fatal(err)
				}
				if err := l.ReleaseShared(ctx, key, m, "owner"); err != nil {
					b.Fatal(err)
				}
				return time.Since(t0)
			}
			for b.Loop() {
				t0 := time.Now()
				if _, err := l.Acquire(ctx, key, "owner", 10*time.Second); err != nil {
					b.Fatal(err)
				}
				if err := l.Release(ctx, key, "owner"); err != nil {
					b.Fatal(err)
				}
				tMutex += time.Since(t0)
				tPermit += shared(driver.SharedPermit)
				tRead += shared(driver.SharedRead)
			}
			n := float64(b.N)
			b.ReportMetric(0, "ns/op")
			b.ReportMetric(float64(tMutex.Nanoseconds())/n, "mutex-ns/op")
			b.ReportMetric(float64(tPermit.Nanoseconds())/n, "permit-ns/op")
			b.ReportMetric(float64(tRead.Nanoseconds())/n, "read-ns/op")
			b.ReportMetric(float64(tPermit)/float64(tMutex), "permit/mutex")
			b.ReportMetric(float64(tRead)/float64(tMutex), "read/mutex")
		})
	}
}
