package etcd

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// counter counts the messages a client sends to the server: unary calls
// and messages sent on streams (keepalives, watch creations).
type counter struct{ n atomic.Int64 }

type countingStream struct {
	grpc.ClientStream
	c *counter
}

func (s countingStream) SendMsg(m any) error { s.c.n.Add(1); return s.ClientStream.SendMsg(m) }

func (c *counter) client(b testing.TB) *clientv3.Client {
	b.Helper()
	eps := strings.Split(strings.TrimPrefix(testURL(b), "etcd://"), ",")
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				c.n.Add(1)
				return invoker(ctx, method, req, reply, cc, opts...)
			}),
			grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				s, err := streamer(ctx, desc, cc, method, opts...)
				if err != nil {
					return nil, err
				}
				return countingStream{s, c}, nil
			}),
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	return cli
}

// BenchmarkAcquireRelease: one uncontended acquire+release per op, by this
// driver and by the raw client doing the same work, on one client.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	var cnt counter
	cli := cnt.client(b)
	pfx := "/bench-" + randHex(4)
	ttl := 10 * time.Second

	run := func(b *testing.B, op func(i int)) {
		b.ReportAllocs()
		op(-1) // warm up (connection, spare lease)
		start := cnt.n.Load()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			op(i)
		}
		b.StopTimer()
		b.ReportMetric(float64(cnt.n.Load()-start)/float64(b.N), "reqs/op")
	}

	b.Run("driver", func(b *testing.B) {
		l, err := New(context.Background(), cli, &Options{Prefix: pfx})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		run(b, func(int) {
			if _, err := l.Acquire(ctx, "k", "owner", ttl); err != nil {
				b.Fatal(err)
			}
			if err := l.Release(ctx, "k", "owner"); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("locker", func(b *testing.B) {
		d, err := New(context.Background(), cli, &Options{Prefix: pfx})
		if err != nil {
			b.Fatal(err)
		}
		l := locker.New(d)
		defer l.Close()
		run(b, func(int) {
			lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(ttl))
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
	// The floor: a transaction putting the key with a lease if absent,
	// then a delete (the lease granted once, outside the loop).
	b.Run("raw-txn-put+delete", func(b *testing.B) {
		g, err := cli.Grant(ctx, 60)
		if err != nil {
			b.Fatal(err)
		}
		defer cli.Revoke(ctx, g.ID)
		k := pfx + "/raw"
		run(b, func(int) {
			r, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
				Then(clientv3.OpPut(k, "owner", clientv3.WithLease(g.ID))).
				Else(clientv3.OpGet(k)).Commit()
			if err != nil || !r.Succeeded {
				b.Fatal(err)
			}
			if _, err := cli.Delete(ctx, k); err != nil {
				b.Fatal(err)
			}
		})
	})
	// A lease per lock without reuse: grant, txn put, revoke.
	b.Run("raw-grant+txn+revoke", func(b *testing.B) {
		k := pfx + "/raw2"
		run(b, func(int) {
			g, err := cli.Grant(ctx, 10)
			if err != nil {
				b.Fatal(err)
			}
			r, err := cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
				Then(clientv3.OpPut(k, "owner", clientv3.WithLease(g.ID))).
				Else(clientv3.OpGet(k)).Commit()
			if err != nil || !r.Succeeded {
				b.Fatal(err)
			}
			if _, err := cli.Revoke(ctx, g.ID); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("concurrency.Mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, pfx+"/mutex")
		run(b, func(int) {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		})
	})
}

// BenchmarkAcquireReleaseInterleaved alternates this driver's
// acquire+release with the raw client's txn put + delete in the same loop,
// so that both see the same load on a shared machine, and reports the
// ratio of their mean times.
func BenchmarkAcquireReleaseInterleaved(b *testing.B) {
	ctx := context.Background()
	cli := (&counter{}).client(b)
	pfx := "/bench-" + randHex(4)
	l, err := New(context.Background(), cli, &Options{Prefix: pfx})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	g, err := cli.Grant(ctx, 600)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Revoke(ctx, g.ID)
	k := pfx + "/raw"
	drv := func() {
		if _, err := l.Acquire(ctx, "k", "owner", 10*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, "k", "owner"); err != nil {
			b.Fatal(err)
		}
	}
	raw := func() {
		r, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, "owner", clientv3.WithLease(g.ID))).
			Else(clientv3.OpGet(k)).Commit()
		if err != nil || !r.Succeeded {
			b.Fatal(err)
		}
		if _, err := cli.Delete(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
	drv()
	raw()
	var dt, rt time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		first, second, fd, sd := drv, raw, &dt, &rt
		if i%2 == 1 {
			first, second, fd, sd = raw, drv, &rt, &dt
		}
		t0 := time.Now()
		first()
		t1 := time.Now()
		second()
		*fd += t1.Sub(t0)
		*sd += time.Since(t1)
	}
	b.StopTimer()
	b.ReportMetric(float64(dt.Nanoseconds())/float64(b.N), "driver-ns/op")
	b.ReportMetric(float64(rt.Nanoseconds())/float64(b.N), "raw-ns/op")
	b.ReportMetric(float64(dt)/float64(rt), "driver/raw")
}

// worker is one contending process: acquire blocks until it holds the lock
// and returns its release.
type worker func(ctx context.Context) (release func(), err error)

// benchHandoff runs n workers contending for one lock, each holding it for
// hold, until b.N grants. It reports the mean handoff time (from the start
// of a release to the next holder's grant) and server requests per grant.
func benchHandoff(b *testing.B, n int, hold time.Duration, newWorker func(b *testing.B, c *counter) worker) {
	var cnt counter
	workers := make([]worker, n)
	for i := range workers {
		workers[i] = newWorker(b, &cnt)
	}
	// A write round trip (a put) on an idle client, for reference: both
	// the release and the next grant are writes.
	rttCli := (&counter{}).client(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rttStart := time.Now()
	for range 20 {
		if _, err := rttCli.Put(ctx, "/rtt", "x"); err != nil {
			b.Fatal(err)
		}
	}
	rtt := time.Since(rttStart) / 20

	b.ReportAllocs()
	var (
		grants, handoffs, sum atomic.Int64
		same, sameSum         atomic.Int64
		lastWorker            atomic.Int64
		lastRelease           atomic.Int64 // ns since base, 0 = none
		base                  = time.Now()
		wg                    sync.WaitGroup
		firstErr              error
		errOnce               sync.Once
	)
	startReqs := cnt.n.Load()
	b.ResetTimer()
	for wi, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				release, err := w(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errOnce.Do(func() { firstErr = err })
						cancel()
					}
					return
				}
				now := int64(time.Since(base))
				if lr := lastRelease.Swap(0); lr != 0 {
					sum.Add(now - lr)
					handoffs.Add(1)
					if lastWorker.Load() == int64(wi) {
						same.Add(1)
						sameSum.Add(now - lr)
					}
				}
				lastWorker.Store(int64(wi))
				time.Sleep(hold) // the critical section: part of the workload
				if grants.Add(1) >= int64(b.N) {
					cancel()
				}
				lastRelease.Store(int64(time.Since(base)))
				release()
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	if h := handoffs.Load(); h > 0 {
		b.ReportMetric(float64(sum.Load())/float64(h)/1e3, "handoff-µs")
	}
	b.ReportMetric(float64(cnt.n.Load()-startReqs)/float64(grants.Load()), "reqs/grant")
	if h := handoffs.Load(); h > 0 {
		b.ReportMetric(float64(same.Load())/float64(h), "regrant-ratio")
	}
	if s := same.Load(); s > 0 && s < handoffs.Load() {
		b.ReportMetric(float64(sum.Load()-sameSum.Load())/float64(handoffs.Load()-s)/1e3, "other-handoff-µs")
	}
	b.ReportMetric(float64(rtt.Microseconds()), "put-rtt-µs")
}

// BenchmarkHandoff: n processes (each its own client) contend for one key
// and hold it 5ms each time; this driver through package locker versus
// concurrency.Mutex.
func BenchmarkHandoff(b *testing.B) {
	hold := 5 * time.Millisecond
	for _, n := range []int{2, 8, 16} {
		pfx := "/handoff-" + randHex(4)
		b.Run("locker/waiters="+itoa(n), func(b *testing.B) {
			benchHandoff(b, n, hold, func(b *testing.B, c *counter) worker {
				d, err := New(context.Background(), c.client(b), &Options{Prefix: pfx})
				if err != nil {
					b.Fatal(err)
				}
				l := locker.New(d)
				b.Cleanup(func() { l.Close() })
				return func(ctx context.Context) (func(), error) {
					lk, err := l.Acquire(ctx, "k", locker.WithTTL(10*time.Second))
					if err != nil {
						return nil, err
					}
					return func() { _ = lk.Release(context.Background()) }, nil
				}
			})
		})
		b.Run("concurrency.Mutex/waiters="+itoa(n), func(b *testing.B) {
			benchHandoff(b, n, hold, func(b *testing.B, c *counter) worker {
				s, err := concurrency.NewSession(c.client(b), concurrency.WithTTL(10))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { s.Close() })
				m := concurrency.NewMutex(s, pfx+"/mutex")
				return func(ctx context.Context) (func(), error) {
					if err := m.Lock(ctx); err != nil {
						return nil, err
					}
					return func() { _ = m.Unlock(context.Background()) }, nil
				}
			})
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// BenchmarkSharedInterleaved runs an uncontended semaphore permit
// acquire+release and a read acquire+release beside the mutex's
// acquire+release, on one Locker, rotating their order in one loop so that
// all three see the same load, and reports the ratios of their mean times
// (the target: at most 1.3×).
func BenchmarkSharedInterleaved(b *testing.B) {
	ctx := context.Background()
	cli := (&counter{}).client(b)
	l, err := New(context.Background(), cli, &Options{Prefix: "/bench-" + randHex(4)})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	const ttl = 10 * time.Second
	mutex := func() {
		if _, err := l.Acquire(ctx, "k", "owner", ttl); err != nil {
			b.Fatal(err)
		}
		if err := l.Release(ctx, "k", "owner"); err != nil {
			b.Fatal(err)
		}
	}
	shared := func(mode driver.SharedMode) func() {
		return func() {
			r := driver.SharedRequest{Mode: mode, Owner: "owner", TTL: ttl, Limit: 8}
			if _, err := l.AcquireShared(ctx, "k", r); err != nil {
				b.Fatal(err)
			}
			if err := l.ReleaseShared(ctx, "k", mode, "owner"); err != nil {
				b.Fatal(err)
			}
		}
	}
	ops := []func(){mutex, shared(driver.SharedPermit), shared(driver.SharedRead)}
	for _, op := range ops {
		op() // warm up: connection, spare leases
	}
	var took [3]time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range ops {
			k := (i + j) % len(ops)
			t0 := time.Now()
			ops[k]()
			took[k] += time.Since(t0)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "mutex-ns/op")
	b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "permit-ns/op")
	b.ReportMetric(float64(took[2].Nanoseconds())/float64(b.N), "read-ns/op")
	b.ReportMetric(float64(took[1])/float64(took[0]), "permit/mutex")
	b.ReportMetric(float64(took[2])/float64(took[0]), "read/mutex")
}
