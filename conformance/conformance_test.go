package conformance_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
)

const flawEnv = "LOCKER_CONFORMANCE_FLAW"

// TestSuiteCatchesBrokenDrivers runs the suite against drivers that each
// break one guarantee, in a child process (a failing suite must fail its own
// *testing.T), and checks that it fails them at the subtest that covers the
// guarantee. The same driver without a flaw must pass: the suite has no false
// positives on a correct driver.
func TestSuiteCatchesBrokenDrivers(t *testing.T) {
	if flaw := os.Getenv(flawEnv); flaw != "" {
		st := newFlawStore()
		conformance.Run(t, conformance.Harness{
			Open: func(context.Context) (driver.Locker, error) { return &flawed{flaw: flaw, st: st}, nil },
		})
		return
	}
	cases := []struct{ flaw, failing string }{
		{"none", ""},
		{"release-without-owner-check", "Driver/Ownership"},
		{"refresh-revives-expired", "Driver/RefreshDoesNotRevive"},
		{"check-then-set", "Driver/AtomicAcquire"},
		{"tokens-repeat-after-expiry", "Driver/Fencing"},
		{"never-expires", "Driver/Expiry"},
		{"ignores-context", "Driver/Context"},
	}
	for _, c := range cases {
		t.Run(c.flaw, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSuiteCatchesBrokenDrivers$", "-test.v", "-test.count=1",
				"-test.timeout=10m")
			cmd.Env = append(os.Environ(), flawEnv+"="+c.flaw)
			out, err := cmd.CombinedOutput()
			if c.failing == "" {
				if err != nil {
					t.Fatalf("the suite failed a driver without a flaw: %v\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("the suite passed a driver whose flaw is %q\n%s", c.flaw, out)
			}
			want := "--- FAIL: TestSuiteCatchesBrokenDrivers/" + c.failing + " "
			if !strings.Contains(string(out), want) {
				t.Fatalf("the suite failed flaw %q, but not at %s:\n%s", c.flaw, c.failing, out)
			}
		})
	}
}

// flawStore is the "server" shared by every flawed Locker of one run.
// Expired records stay in the map (so a reviving Refresh can find them) and
// are treated as absent.
type flawStore struct {
	mu      sync.Mutex
	locks   map[string]*flawRec
	counter uint64
	perKey  map[string]uint64
}

type flawRec struct {
	owner   string
	token   uint64
	expires time.Time
}

func newFlawStore() *flawStore {
	return &flawStore{locks: map[string]*flawRec{}, perKey: map[string]uint64{}}
}

func (s *flawStore) live(key string) *flawRec {
	r := s.locks[key]
	if r == nil || !time.Now().Before(r.expires) {
		return nil
	}
	return r
}

// flawed is a small correct driver with one deliberate flaw, named by flaw.
type flawed struct {
	flaw   string
	st     *flawStore
	mu     sync.Mutex
	closed bool
}

func (f *flawed) check(ctx context.Context, key string, ttl time.Duration, needTTL bool) error {
	if f.flaw != "ignores-context" {
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	switch {
	case closed:
		return driver.ErrClosed
	case key == "":
		return fmt.Errorf("%w: empty key", driver.ErrInvalid)
	case needTTL && ttl <= 0:
		return fmt.Errorf("%w: ttl %v", driver.ErrInvalid, ttl)
	}
	return nil
}

func (f *flawed) expiry(ttl time.Duration) time.Time {
	if f.flaw == "never-expires" {
		return time.Now().Add(24 * time.Hour)
	}
	return time.Now().Add(ttl)
}

func (f *flawed) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := f.check(ctx, key, ttl, true); err != nil {
		return 0, err
	}
	s := f.st
	s.mu.Lock()
	if r := s.live(key); r != nil {
		defer s.mu.Unlock()
		if r.owner != owner {
			return 0, &driver.HeldError{Remaining: time.Until(r.expires)}
		}
		r.expires = f.expiry(ttl)
		return r.token, nil
	}
	if f.flaw == "check-then-set" {
		// The classic GET-then-SET: the key looked free; set it without
		// checking again.
		s.mu.Unlock()
		time.Sleep(200 * time.Microsecond)
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	var tok uint64
	if f.flaw == "tokens-repeat-after-expiry" {
		// A per-key counter that is lost when the lock expires, like a
		// counter key with the lock's TTL and no floor.
		if old := s.locks[key]; old != nil && !time.Now().Before(old.expires) {
			s.perKey[key] = 0
		}
		s.perKey[key]++
		tok = s.perKey[key]
	} else {
		s.counter++
		tok = s.counter
	}
	s.locks[key] = &flawRec{owner: owner, token: tok, expires: f.expiry(ttl)}
	return tok, nil
}

func (f *flawed) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := f.check(ctx, key, ttl, true); err != nil {
		return err
	}
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key)
	if f.flaw == "refresh-revives-expired" {
		r = s.locks[key] // expired or not
	}
	if r == nil || r.owner != owner {
		return driver.ErrNotHeld
	}
	r.expires = f.expiry(ttl)
	return nil
}

func (f *flawed) Release(ctx context.Context, key, owner string) error {
	if err := f.check(ctx, key, 0, false); err != nil {
		return err
	}
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key)
	if r == nil || (r.owner != owner && f.flaw != "release-without-owner-check") {
		return driver.ErrNotHeld
	}
	delete(s.locks, key)
	return nil
}

func (f *flawed) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := f.check(ctx, key, 0, false); err != nil {
		return driver.Info{}, err
	}
	s := f.st
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.live(key)
	if r == nil {
		return driver.Info{}, driver.ErrNotHeld
	}
	return driver.Info{Owner: r.owner, Token: r.token, Remaining: time.Until(r.expires)}, nil
}

func (f *flawed) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}
