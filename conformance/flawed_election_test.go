package conformance_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

// electionVariant runs the suite on flawedElection: the flawed driver of
// the blocking variant, correct, with one flaw switched on that touches
// only the locks of elections (keys under locker.ElectionPrefix), so that
// only the election's checks can see it.
const electionVariant = "election"

// electionMutants break one promise of an election each, through the
// driver; the trace table's EL rows and row F6 name them.
var electionMutants = []mutant{
	{"election-two-leaders", "Locker/ElectionOneLeader", electionVariant},
	{"election-terms-repeat", "Locker/ElectionTerms", electionVariant},
	{"election-frees-early", "Locker/ElectionNoPhantom", electionVariant},
	{"election-value-truncated", "Locker/ElectionValue", electionVariant},
	{"election-inspect-stale", "Locker/ElectionObserve", electionVariant},
	{"election-release-noop", "Locker/ElectionResign", electionVariant},
	{"election-frees-on-cut", "Faults/Cut", electionVariant},
}

func init() { mutants = append(mutants, electionMutants...) }

// runElection runs the suite in a mutant's child process on flawedElection.
func runElection(t *testing.T, flaw string) {
	st := newFlawStore(flaw)
	if os.Getenv(conformance.FaultTimeEnv) == "" {
		// Long enough that a few cuts hit the election's leader.
		t.Setenv(conformance.FaultTimeEnv, "4s")
	}
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Locker, error) {
			return &flawedElection{flawedBlocking: flawedBlocking{&flawed{st: st}}, stale: map[string]staleInfo{}}, nil
		},
		Cut:          func(d driver.Locker) (func(), error) { return d.(*flawedElection).cutOff() },
		Reset:        func(d driver.Locker) error { d.(*flawedElection).resetConns(); return nil },
		Restart:      func(context.Context) error { st.restart(false); return nil },
		RestartEmpty: func(context.Context) error { st.restart(true); return nil },
	})
}

// flawedElection is the flawed driver (blocking variant) with one flaw of
// the election's locks, named by the store's flaw.
type flawedElection struct {
	flawedBlocking
	mu    sync.Mutex
	stale map[string]staleInfo // election-inspect-stale
}

type staleInfo struct {
	info driver.Info
	err  error
	at   time.Time
}

func isElection(key string) bool { return strings.HasPrefix(key, locker.ElectionPrefix) }

// staleTerm is the term election-terms-repeat reports for every grant.
const staleTerm = 7

// before applies the flaws that act before a grant of an election's lock:
// it returns the TTL the server keeps.
func (f *flawedElection) before(key string, ttl time.Duration) time.Duration {
	if !isElection(key) {
		return ttl
	}
	if f.is("election-two-leaders") {
		// The server grants whoever asks: the holder's record is dropped,
		// and the holder is not told.
		s := f.st
		s.mu.Lock()
		if r := s.live(key); r != nil {
			dropQuietly(s, key, r)
		}
		s.mu.Unlock()
	}
	return ttl
}

// dropQuietly frees r, the live record of key, as a server that forgets a
// lock: waiters are woken and others may take it, but the holder's watch
// is dropped unfired, so it hears nothing. s.mu is held.
func dropQuietly(s *flawStore, key string, r *flawRec) {
	r.timer.Stop()
	delete(s.locks, key)
	for w := range s.watches[key] {
		if w.owner == r.owner && w.token == r.token {
			delete(s.watches[key], w)
		}
	}
	s.quiet = true
	s.changed(key, true)
	s.quiet = false
}

// freeEarly makes the server forget the grant of key to owner half way
// through its TTL (election-frees-early), telling no one.
func (f *flawedElection) freeEarly(key, owner string, ttl time.Duration) {
	s := f.st
	s.mu.Lock()
	r := s.live(key)
	s.mu.Unlock()
	if r == nil || r.owner != owner {
		return
	}
	time.AfterFunc(ttl/2, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.live(key) == r {
			dropQuietly(s, key, r)
		}
	})
}

// after applies the flaws that act on a grant of an election's lock.
func (f *flawedElection) after(key, owner string, ttl time.Duration, tok uint64, err error) (uint64, error) {
	if err != nil || !isElection(key) {
		return tok, err
	}
	if f.is("election-frees-early") {
		f.freeEarly(key, owner, ttl)
	}
	if f.is("election-terms-repeat") {
		return staleTerm, nil
	}
	return tok, nil
}

func (f *flawedElection) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	tok, err := f.flawedBlocking.Acquire(ctx, key, owner, f.before(key, ttl))
	return f.after(key, owner, ttl, tok, err)
}

func (f *flawedElection) AcquireWait(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	tok, err := f.flawedBlocking.AcquireWait(ctx, key, owner, f.before(key, ttl))
	return f.after(key, owner, ttl, tok, err)
}

func (f *flawedElection) Release(ctx context.Context, key, owner string) error {
	if isElection(key) && f.is("election-release-noop") {
		return nil // a resign that frees nothing: the next leader waits for the TTL
	}
	return f.flawedBlocking.Release(ctx, key, owner)
}

func (f *flawedElection) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if !isElection(key) {
		return f.flawedBlocking.Inspect(ctx, key)
	}
	if f.is("election-inspect-stale") {
		// A cache in front of the server, never invalidated within 5s.
		f.mu.Lock()
		c, ok := f.stale[key]
		f.mu.Unlock()
		if ok && time.Since(c.at) < 5*time.Second {
			return c.info, c.err
		}
	}
	in, err := f.flawedBlocking.Inspect(ctx, key)
	switch {
	case err != nil:
	case f.is("election-terms-repeat"):
		in.Token = staleTerm
	case f.is("election-value-truncated"):
		in.Owner = in.Owner[:min(len(in.Owner), 64)] // stores 64 bytes, declares no limit
	}
	if f.is("election-inspect-stale") {
		f.mu.Lock()
		f.stale[key] = staleInfo{in, err, time.Now()}
		f.mu.Unlock()
	}
	return in, err
}

// cutOff is Harness.Cut. With election-frees-on-cut, the server also frees
// the election locks of the Locker it cut off, and grants them to others,
// while their holder hears nothing.
func (f *flawedElection) cutOff() (func(), error) {
	heal, err := f.flawed.cutOff()
	if err != nil || !f.is("election-frees-on-cut") {
		return heal, err
	}
	s := f.st
	s.mu.Lock()
	for key, r := range s.locks {
		if isElection(key) && r.by == f.flawed && s.live(key) == r {
			dropQuietly(s, key, r)
		}
	}
	s.mu.Unlock()
	return heal, nil
}
