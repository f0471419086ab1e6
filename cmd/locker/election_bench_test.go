package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/go-locker/locker"
)

// BenchmarkElection measures, per backend, each iteration one after the
// other on one election (its lock TTL: electBackends):
//
//   - crash failover: a leader elected in a `locker run --elect` process
//     is killed (SIGKILL, with its job), and a candidate already
//     campaigning on a Locker of this process is elected: the time from
//     the kill to the return of its Campaign, over the TTL
//     (failover/ttl, the median; failover-max/ttl, the longest). The
//     leader's lock is left to expire, so this is about the TTL left at
//     the kill (renewals run every third of it) plus the backend's expiry
//     lag and the candidate's wait.
//   - resign failover: that leader resigns (Release) while another
//     candidate campaigns: the time from the Release call to the return of
//     the next Campaign; and, interleaved with it, the mutex handoff: the
//     same on a plain lock of the same backend, between two other Lockers
//     (resign/handoff: the ratio of the medians).
//   - Observe latency: an observer (Election.Observe, its own Locker) yields
//     each new term of the two in-process candidates; from the return of
//     the Campaign to the observer's report, negative counted as 0
//     (observe-p50-ms, observe-max-ms, over both terms of every iteration).
//
// Each waiter is given settle (50ms) to reach its wait before the holder
// goes: no backend tells generically that a waiter is queued.
//
//	go test -run '^$' -bench '^BenchmarkElection$' -benchtime 5x ./cmd/locker
func BenchmarkElection(b *testing.B) {
	for _, be := range electBackends(b) {
		b.Run(be.name, func(b *testing.B) {
			url := be.url()
			r := &electBench{
				b: b, name: "bench-" + be.name, ttl: be.ttl, dir: b.TempDir(),
				env:    []string{"LOCKER_URL=" + url},
				grants: map[uint64]time.Time{},
			}
			for i := range r.cands {
				r.cands[i], r.mutex[i] = openLocker(b, url), openLocker(b, url)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			r.obs = startObserved(ctx, openLocker(b, url).Election(r.name))
			for b.Loop() {
				r.round(ctx)
			}
			b.StopTimer()
			r.report()
		})
	}
}

// settle is how long a waiter is given to reach its wait.
const settle = 50 * time.Millisecond

// electBench is one backend's BenchmarkElection.
type electBench struct {
	b     *testing.B
	name  string // the election
	ttl   time.Duration
	dir   string
	env   []string
	cands [2]*locker.Locker // the in-process candidates
	mutex [2]*locker.Locker // the mutex handoff's Lockers
	obs   *observed

	crash, resign, handoff []time.Duration
	grants                 map[uint64]time.Time // in-process terms: when Campaign returned
}

// granted is the result of an Acquire or Campaign run in a goroutine.
type granted struct {
	lk  *locker.Lock
	at  time.Time
	err error
}

func async(f func() (*locker.Lock, error)) <-chan granted {
	c := make(chan granted, 1)
	go func() {
		lk, err := f()
		c <- granted{lk, time.Now(), err}
	}()
	return c
}

func (r *electBench) get(c <-chan granted) granted {
	r.b.Helper()
	select {
	case g := <-c:
		if g.err != nil {
			r.b.Fatal(g.err)
		}
		return g
	case <-time.After(30 * time.Second):
		r.b.Fatal("no grant within 30s")
	}
	return granted{}
}

// campaign starts candidate i's Campaign.
func (r *electBench) campaign(ctx context.Context, i int) <-chan granted {
	return async(func() (*locker.Lock, error) {
		return r.cands[i].Election(r.name).Campaign(ctx, "c"+uitoa(uint64(i)), locker.WithTTL(r.ttl))
	})
}

// round is one iteration: crash, resign, handoff.
func (r *electBench) round(ctx context.Context) {
	lb := r.crashFailover(ctx)
	r.obs.await(r.b, lb.Token(), 10*time.Second) // each term is seen before it ends
	la := r.resignFailover(ctx, lb)
	r.mutexHandoff(ctx)
	r.obs.await(r.b, la.Token(), 10*time.Second)
	r.release(ctx, la)()
}

// crashFailover elects a leader in another process, kills it, and returns
// the in-process candidate elected in its place.
func (r *electBench) crashFailover(ctx context.Context) *locker.Lock {
	b := r.b
	pidfile := filepath.Join(r.dir, "job")
	_ = os.Remove(pidfile)
	p := start(b, r.env, append([]string{"run", "--ttl", r.ttl.String(), "--elect", "leader", r.name, "--"}, child("trap", pidfile)...)...)
	p.expect(b, "ready") // elected: the job runs
	drain(p)
	job := pidOf(b, pidfile)
	g, d := r.handover(r.campaign(ctx, 1), func() {
		p.signal(b, syscall.SIGKILL)
		_ = syscall.Kill(-job, syscall.SIGKILL) // the job's process group
	})
	r.crash = append(r.crash, d)
	r.grants[g.lk.Token()] = g.at
	p.wait(b)
	return g.lk
}

// resignFailover has cur resign while candidate 0 campaigns, and returns
// candidate 0's lead.
func (r *electBench) resignFailover(ctx context.Context, cur *locker.Lock) *locker.Lock {
	g, d := r.handover(r.campaign(ctx, 0), r.release(ctx, cur))
	r.resign = append(r.resign, d)
	r.grants[g.lk.Token()] = g.at
	return g.lk
}

// mutexHandoff hands a plain lock from one Locker to a waiting other.
func (r *electBench) mutexHandoff(ctx context.Context) {
	key := "mutex-" + r.name
	opts := []locker.Option{locker.WithTTL(r.ttl)}
	lk, err := r.mutex[0].Acquire(ctx, key, opts...)
	if err != nil {
		r.b.Fatal(err)
	}
	c := async(func() (*locker.Lock, error) { return r.mutex[1].Acquire(ctx, key, opts...) })
	g, d := r.handover(c, r.release(ctx, lk))
	r.handoff = append(r.handoff, d)
	r.release(ctx, g.lk)()
}

// handover gives the waiter of c settle to reach its wait, runs free (the
// holder goes), and returns the waiter's grant and the time from free to
// it.
func (r *electBench) handover(c <-chan granted, free func()) (granted, time.Duration) {
	time.Sleep(settle)
	at := time.Now()
	free()
	g := r.get(c)
	return g, g.at.Sub(at)
}

// release returns a func that releases lk.
func (r *electBench) release(ctx context.Context, lk *locker.Lock) func() {
	return func() {
		if err := lk.Release(ctx); err != nil {
			r.b.Fatal(err)
		}
	}
}

// report computes the metrics.
func (r *electBench) report() {
	var lat []time.Duration
	for term, at := range r.grants {
		seen, _ := r.obs.await(r.b, term, 0)
		lat = append(lat, max(seen.Sub(at), 0))
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	ttl := float64(r.ttl)
	r.b.ReportMetric(float64(medianDur(r.crash))/ttl, "failover/ttl")
	r.b.ReportMetric(float64(slices.Max(r.crash))/ttl, "failover-max/ttl")
	r.b.ReportMetric(float64(medianDur(r.resign))/float64(medianDur(r.handoff)), "resign/handoff")
	r.b.ReportMetric(ms(medianDur(r.resign)), "resign-p50-ms")
	r.b.ReportMetric(ms(medianDur(r.handoff)), "handoff-p50-ms")
	r.b.ReportMetric(ms(medianDur(lat)), "observe-p50-ms")
	r.b.ReportMetric(ms(slices.Max(lat)), "observe-max-ms")
}

// medianDur returns the median of d (the upper one of an even count).
func medianDur(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
