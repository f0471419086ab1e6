package scaletest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/etcd"
	"github.com/go-locker/locker/drivers/postgres"
	"github.com/go-locker/locker/drivers/redis"
	"github.com/go-locker/locker/drivers/rueidis"
)

// The child process: it opens one Locker on the URL it is given, takes the
// locks, holds them, and prints one result line. Its markers on stdout
// tell the parent when the hold window starts and ends, so that the parent
// reads the server's counters over the same window.
const (
	envBackend = "LOCKER_SCALETEST_CHILD_BACKEND"
	envURL     = "LOCKER_SCALETEST_CHILD_URL"
	envParams  = "LOCKER_SCALETEST_CHILD_PARAMS"

	markHoldStart = "HOLD-START"
	markHoldEnd   = "HOLD-END"
	markResult    = "RESULT "
)

// params is the size of a run.
type params struct {
	Locks       int
	Concurrency int
	TTL         time.Duration
	Hold        time.Duration
}

// result is what the child reports.
type result struct {
	Acquired    int
	Refused     int
	Lost        int // lost during the hold window
	LostLate    int // lost after it, before Release
	ReleaseErrs int
	Renewals    int64         // Refresh calls during the hold window
	RenewErrs   int64         // of which failed
	CPU         time.Duration // user+system CPU of the child over the window
	Window      time.Duration
	Errors      []string // a sample
}

// Refresh counters: each embeds the driver's own type, so every optional
// interface the root package looks for is still there, and counts Refresh.
type counter struct {
	n, errs atomic.Int64
	first   atomic.Pointer[string] // the first error
}

func (c *counter) count(err error) error {
	c.n.Add(1)
	if err != nil {
		c.errs.Add(1)
		msg := err.Error()
		if c.first.CompareAndSwap(nil, &msg) && os.Getenv("LOCKER_SCALETEST_DEBUG") != "" {
			fmt.Fprintln(os.Stderr, "first failed renewal:", msg)
		}
	}
	return err
}

type countedEtcd struct {
	*etcd.Locker
	c *counter
}

func (d countedEtcd) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return d.c.count(d.Locker.Refresh(ctx, key, owner, ttl))
}

type countedPostgres struct {
	*postgres.Locker
	c *counter
}

func (d countedPostgres) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return d.c.count(d.Locker.Refresh(ctx, key, owner, ttl))
}

type countedRedis struct {
	*redis.Locker
	c *counter
}

func (d countedRedis) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return d.c.count(d.Locker.Refresh(ctx, key, owner, ttl))
}

func (d countedRedis) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	return d.c.countAll(d.Locker.RefreshBatch(ctx, items))
}

type countedRueidis struct {
	*rueidis.Locker
	c *counter
}

func (d countedRueidis) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	return d.c.count(d.Locker.Refresh(ctx, key, owner, ttl))
}

func (d countedRueidis) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	return d.c.countAll(d.Locker.RefreshBatch(ctx, items))
}

// countAll counts each item of a batch as one renewal.
func (c *counter) countAll(errs []error) []error {
	for _, err := range errs {
		_ = c.count(err)
	}
	return errs
}

// hideBatch, embedded beside a counted driver (at the same depth as that
// driver's RefreshBatch), makes RefreshBatch an ambiguous selector, so the
// wrapper is not a driver.BatchRefresher and package locker renews one lock
// per call, as it did before batching; every other method is the driver's.
type hideBatch struct{}

func (hideBatch) RefreshBatch(context.Context, []driver.RefreshItem) []error { return nil }

type unbatchedRedis struct {
	countedRedis
	hideBatch
}

type unbatchedRueidis struct {
	countedRueidis
	hideBatch
}

var (
	_ driver.BatchRefresher = countedRedis{}
	_ driver.HoldWatcher    = unbatchedRedis{}
)

// openCounted opens the backend's driver on url with its defaults. The
// "-unbatched" backends hide driver.BatchRefresher.
func openCounted(ctx context.Context, backend, url string, c *counter) (driver.Locker, error) {
	switch backend {
	case "redis-unbatched":
		d, err := redis.Open(ctx, url)
		return unbatchedRedis{countedRedis{d, c}, hideBatch{}}, err
	case "rueidis":
		d, err := rueidis.Open(ctx, url)
		return countedRueidis{d, c}, err
	case "rueidis-unbatched":
		d, err := rueidis.Open(ctx, url)
		return unbatchedRueidis{countedRueidis{d, c}, hideBatch{}}, err
	case "etcd":
		d, err := etcd.Open(ctx, url)
		return countedEtcd{d, c}, err
	case "postgres-lease":
		d, err := postgres.Open(ctx, url)
		return countedPostgres{d, c}, err
	case "redis":
		d, err := redis.Open(ctx, url)
		return countedRedis{d, c}, err
	}
	return nil, fmt.Errorf("unknown backend %q", backend)
}

// childMain runs the child and exits; it is called from TestMain.
func childMain() {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv(envParams)), &p); err != nil {
		fmt.Fprintln(os.Stderr, "params:", err)
		os.Exit(2)
	}
	r, err := runClient(os.Getenv(envBackend), os.Getenv(envURL), p)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, _ := json.Marshal(r)
	fmt.Printf("%s%s\n", markResult, b)
	os.Exit(0)
}

func runClient(backend, url string, p params) (*result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), p.Hold+10*time.Minute)
	defer cancel()
	var c counter
	d, err := openCounted(ctx, backend, url, &c)
	if err != nil {
		return nil, err
	}
	l := locker.New(d)
	defer l.Close()
	r := &result{}
	locks := acquireAll(ctx, l, p, r)
	fmt.Println(markHoldStart)
	n0, e0, cpu0, t0 := c.n.Load(), c.errs.Load(), cpuTime(), time.Now()
	if os.Getenv("LOCKER_SCALETEST_DEBUG") != "" {
		time.AfterFunc(p.Hold/2, func() { _ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 1) })
	}
	if path := os.Getenv("LOCKER_SCALETEST_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			time.AfterFunc(p.Hold, pprof.StopCPUProfile)
		}
	}
	time.Sleep(p.Hold) // the hold itself is what is measured
	r.Renewals, r.RenewErrs = c.n.Load()-n0, c.errs.Load()-e0
	r.CPU, r.Window = cpuTime()-cpu0, time.Since(t0)
	fmt.Println(markHoldEnd)
	for _, lk := range locks {
		select {
		case <-lk.Lost():
			r.Lost++
			r.note(fmt.Sprintf("lost %s: %v", lk.Key(), lk.Release(ctx)))
		default:
		}
	}
	releaseAll(ctx, locks, p.Concurrency, r)
	if e := c.first.Load(); e != nil {
		r.note("first failed renewal: " + *e)
	}
	return r, nil
}

var noteMu sync.Mutex

func (r *result) note(s string) {
	noteMu.Lock()
	defer noteMu.Unlock()
	if len(r.Errors) < 10 {
		r.Errors = append(r.Errors, s)
	}
}

// acquireAll takes p.Locks locks with p.Concurrency acquirers.
func acquireAll(ctx context.Context, l *locker.Locker, p params, r *result) []*locker.Lock {
	locks := make([]*locker.Lock, p.Locks)
	var next atomic.Int64
	var refused atomic.Int64
	var wg sync.WaitGroup
	for range p.Concurrency {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= p.Locks {
					return
				}
				actx, cancel := context.WithTimeout(ctx, time.Minute)
				lk, err := l.Acquire(actx, fmt.Sprintf("scale/%d", i), locker.WithTTL(p.TTL))
				cancel()
				if err != nil {
					refused.Add(1)
					r.note(fmt.Sprintf("acquire %d: %v", i, err))
					continue
				}
				locks[i] = lk
			}
		})
	}
	wg.Wait()
	r.Refused = int(refused.Load())
	held := locks[:0]
	for _, lk := range locks {
		if lk != nil {
			held = append(held, lk)
		}
	}
	r.Acquired = len(held)
	return held
}

// releaseAll releases the locks still held, with n goroutines.
func releaseAll(ctx context.Context, locks []*locker.Lock, n int, r *result) {
	ch := make(chan *locker.Lock)
	var errs, lostLate atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for lk := range ch {
				if err := lk.Release(ctx); err != nil {
					if errors.Is(err, locker.ErrNotHeld) {
						lostLate.Add(1)
					}
					errs.Add(1)
					r.note(fmt.Sprintf("release %s: %v", lk.Key(), err))
				}
			}
		})
	}
	for _, lk := range locks {
		select {
		case <-lk.Lost():
		default:
			ch <- lk
		}
	}
	close(ch)
	wg.Wait()
	r.ReleaseErrs, r.LostLate = int(errs.Load()), int(lostLate.Load())
}

// cpuTime is the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
