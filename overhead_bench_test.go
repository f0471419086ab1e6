package locker_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker"
	_ "github.com/go-locker/locker/drivers/etcd"
	_ "github.com/go-locker/locker/drivers/file"
	_ "github.com/go-locker/locker/drivers/postgres"
	"github.com/go-locker/locker/drivers/rueidis"
	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
)

// BenchmarkPackageOverDriver measures what package locker adds to its own
// driver: each op is one uncontended driver Acquire+Release and one
// package-level TryAcquire+Release (defaults: auto-renew and the hold watch
// on), run alternately in one loop on the same driver, so that the load of
// a shared machine hits both alike. It reports the mean of each
// (driver-ns, pkg-ns), their ratio (pkg/driver) and the allocations of
// each pair (driver-allocs, pkg-allocs).
//
//	flock /tmp/locker-heavy.lock go test -run '^$' -bench PackageOverDriver -count 5 .
func BenchmarkPackageOverDriver(b *testing.B) {
	b.Run("mem", func(b *testing.B) { packageOverDriver(b, "mem://") })
	b.Run("file", func(b *testing.B) { packageOverDriver(b, "file://"+b.TempDir()) })
	b.Run("redis", func(b *testing.B) { packageOverDriver(b, redistest.Start(b).URL()) })
	b.Run("rueidis", func(b *testing.B) { packageOverDriver(b, rueidis.Scheme+"://"+redistest.Start(b).Addr) })
	b.Run("etcd", func(b *testing.B) { packageOverDriver(b, etcdtest.Start(b).URL("/bench")) })
	b.Run("postgres", func(b *testing.B) {
		pg := pgtest.Start(b)
		b.Run("advisory", func(b *testing.B) { packageOverDriver(b, pg.URL()) })
		b.Run("lease", func(b *testing.B) { packageOverDriver(b, pg.URL()+"&mode=lease") })
	})
}

func packageOverDriver(b *testing.B, url string) {
	l, err := locker.OpenURL(url)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	d := l.Driver()
	drvPair := func() {
		if _, err := d.Acquire(ctx, "drv", "owner", 30*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := d.Release(ctx, "drv", "owner"); err != nil {
			b.Fatal(err)
		}
	}
	pkgPair := func() {
		lk, err := l.TryAcquire(ctx, "pkg", locker.WithTTL(30*time.Second))
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	var drv, pkg time.Duration
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		drvPair()
		t1 := time.Now()
		pkgPair()
		drv += t1.Sub(t0)
		pkg += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(drv.Nanoseconds())/float64(b.N), "driver-ns")
	b.ReportMetric(float64(pkg.Nanoseconds())/float64(b.N), "pkg-ns")
	b.ReportMetric(float64(pkg)/float64(drv), "pkg/driver")
	b.ReportMetric(testing.AllocsPerRun(200, drvPair), "driver-allocs")
	b.ReportMetric(testing.AllocsPerRun(200, pkgPair), "pkg-allocs")
}
