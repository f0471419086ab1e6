package main

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
)

// electBackend is one backend of BenchmarkElection and
// TestElectObserveBound.
type electBackend struct {
	name    string
	ttl     time.Duration // the lock TTL of the candidates
	url     func() string // starts the backend's server on first use
	observe time.Duration // TestElectObserveBound's bound: observeNotified or observePolled
}

// electBackends returns the file driver and each server backend. The
// servers are started on first use, for the whole of tb (Redis and
// rueidis share one server, and so do PostgreSQL's two modes), so tb must
// outlive every sub-test or sub-benchmark that uses them.
func electBackends(tb testing.TB) []electBackend {
	var rs *redistest.Server
	redis := func() *redistest.Server {
		if rs == nil {
			rs = redistest.Start(tb)
		}
		return rs
	}
	var ps *pgtest.Server
	pg := func() *pgtest.Server {
		if ps == nil {
			ps = pgtest.Start(tb)
		}
		return ps
	}
	return []electBackend{
		{"file", time.Second, func() string { return fileURL(tb) }, observeNotified},
		{"redis", time.Second, func() string { return redis().URL() }, observeNotified},
		{"rueidis", time.Second, func() string { return "rueidis://" + redis().Addr }, observeNotified},
		// etcd's shortest TTL is 2s (drivers/etcd DefaultMinTTL).
		{"etcd", 2 * time.Second, func() string { return etcdtest.Start(tb).URL("/locker-elect-bench") }, observeNotified},
		{"postgres", time.Second, func() string { return pg().URL() }, observePolled},
		{"postgres-lease", time.Second, func() string { return pg().URL() + "&mode=lease" }, observeNotified},
	}
}

// observed records, from an Election.Observe loop running in its own
// goroutine, when each term was first yielded and with which value.
type observed struct {
	mu     sync.Mutex
	at     map[uint64]time.Time
	values map[uint64]string
	errs   int // errors yielded (transient: Observe goes on)
}

// startObserved ranges over e.Observe until ctx ends.
func startObserved(ctx context.Context, e *locker.Election) *observed {
	o := &observed{at: map[uint64]time.Time{}, values: map[uint64]string{}}
	go func() {
		for ld, err := range e.Observe(ctx) {
			now := time.Now()
			o.mu.Lock()
			switch {
			case err != nil:
				o.errs++
			case ld.Term != 0:
				if _, ok := o.at[ld.Term]; !ok {
					o.at[ld.Term], o.values[ld.Term] = now, ld.Value
				}
			}
			o.mu.Unlock()
		}
	}()
	return o
}

// await waits until term has been yielded and returns when, and the value.
func (o *observed) await(tb testing.TB, term uint64, d time.Duration) (time.Time, string) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for {
		o.mu.Lock()
		at, ok := o.at[term]
		v, errs := o.values[term], o.errs
		o.mu.Unlock()
		if ok {
			return at, v
		}
		if time.Now().After(deadline) {
			tb.Fatalf("the observer did not yield term %d within %v (%d errors yielded)", term, d, errs)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}

// TestElectObserveBound: on every backend, an observer (Election.Observe
// on its own Locker) yields each of 5 successive terms, with its value,
// within the backend's bound (electBackend.observe) of the grant (the
// return of Campaign on another Locker). Each leader resigns once its term
// has been seen, and the next campaigns after observeVacancy, so that an
// observer that is not notified of grants reads only every 100ms by then.
func TestElectObserveBound(t *testing.T) {
	for _, be := range electBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			url := be.url()
			cand, obs := openLocker(t, url), openLocker(t, url)
			name := "observe-" + be.name
			o := startObserved(ctx, obs.Election(name))
			e := cand.Election(name)
			var lat []time.Duration
			for i := range 5 {
				v := "v" + strconv.Itoa(i)
				lk, err := e.Campaign(ctx, v, locker.WithTTL(be.ttl))
				if err != nil {
					t.Fatal(err)
				}
				granted := time.Now()
				seen, got := o.await(t, lk.Token(), 10*time.Second)
				if got != v {
					t.Errorf("term %d observed with value %q, want %q", lk.Token(), got, v)
				}
				lat = append(lat, max(seen.Sub(granted), 0).Round(time.Millisecond))
				if err := lk.Release(ctx); err != nil {
					t.Fatal(err)
				}
				time.Sleep(observeVacancy) // nobody leads: the observer idles
			}
			t.Logf("%s: each term observed after its grant: %v", be.name, lat)
			for _, d := range lat {
				if d > be.observe {
					t.Errorf("a term was observed %v after its grant, want within %v: %v", d, be.observe, lat)
					break
				}
			}
		})
	}
}

// openLocker opens url for the whole of tb.
func openLocker(tb testing.TB, url string) *locker.Locker {
	tb.Helper()
	l, err := locker.OpenURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	return l
}
