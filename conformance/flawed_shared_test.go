package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/drivers/mem"
)

// sharedVariant runs the suite on flawedShared: the mem driver (the
// reference implementation of driver.SharedLocker) with one flaw of its
// shared holds switched on. The mutex side is mem's, unchanged.
const sharedVariant = "shared"

// sharedMutants break one obligation of driver.SharedLocker each; the
// trace table's S rows name them.
var sharedMutants = []mutant{
	{"shared-limit-plus-one", "Driver/SharedLimit", sharedVariant},
	{"shared-write-as-read", "Driver/SharedLimit", sharedVariant},
	{"shared-limit-plus-one", "Locker/SharedContention", sharedVariant},
	{"shared-write-as-read", "Locker/SharedContention", sharedVariant},
	{"shared-never-expires", "Driver/SharedLeases", sharedVariant},
	{"shared-release-frees-all", "Driver/SharedLeases", sharedVariant},
	{"shared-release-any-owner", "Driver/SharedOwnership", sharedVariant},
	{"shared-tokens-per-locker", "Driver/SharedTokens", sharedVariant},
	{"shared-writer-polls", "Driver/SharedWriterPreference", sharedVariant},
	{"shared-not-idempotent", "Driver/SharedIdempotent", sharedVariant},
	{"shared-upgrade-waits", "Driver/SharedIdempotent", sharedVariant},
	{"shared-limit-unchecked", "Driver/SharedBadInput", sharedVariant},
	{"shared-limit-max-seen", "Driver/SharedPerCallLimit", sharedVariant},
	{"shared-namespace-mutex", "Driver/SharedNamespaces", sharedVariant},
	{"shared-wait-polls", "Driver/SharedWakeups", sharedVariant},
	{"shared-cancel-stays-queued", "Driver/SharedContext", sharedVariant},
	{"shared-frees-on-cut", "Faults/Cut", sharedVariant},
}

func init() { mutants = append(mutants, sharedMutants...) }

// runShared runs the suite in a mutant's child process on flawedShared.
func runShared(t *testing.T, flaw string) {
	store := mem.NewStore()
	st := &sharedFlawState{flaw: flaw, maxSeen: map[string]int{}}
	if os.Getenv(conformance.FaultTimeEnv) == "" {
		// Long enough that a few cuts hit a shared holder.
		t.Setenv(conformance.FaultTimeEnv, "4s")
	}
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Locker, error) {
			c := store.Locker()
			return &flawedShared{Locker: c, sh: c.(driver.SharedLocker), st: st, tokens: map[string]uint64{}, held: map[sharedHold]bool{}}, nil
		},
		Cut: func(d driver.Locker) (func(), error) { return d.(*flawedShared).cutOff(), nil },
	})
}

// sharedHold names one shared hold granted through a flawedShared.
type sharedHold struct {
	key, owner string
	mode       driver.SharedMode
}

type sharedFlawState struct {
	flaw    string
	mu      sync.Mutex
	maxSeen map[string]int // shared-limit-max-seen
}

type flawedShared struct {
	driver.Locker
	sh driver.SharedLocker
	st *sharedFlawState

	mu     sync.Mutex
	local  uint64            // shared-tokens-per-locker
	tokens map[string]uint64 // the same, by key and owner
	cut    chan struct{}     // closed at the heal of Harness.Cut; nil when not cut
	held   map[sharedHold]bool
}

// gate stages Harness.Cut: a call through a Locker that is cut off waits
// for the heal or its context.
func (f *flawedShared) gate(ctx context.Context) error {
	f.mu.Lock()
	cut := f.cut
	f.mu.Unlock()
	if cut == nil {
		return nil
	}
	select {
	case <-cut:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flawed: cut off: %w", ctx.Err())
	}
}

// cutOff is Harness.Cut. With shared-frees-on-cut, the server frees f's
// shared holds at once, and their holders hear nothing (the driver has no
// HoldWatcher) until a refresh reaches the server after the heal.
func (f *flawedShared) cutOff() func() {
	ch := make(chan struct{})
	f.mu.Lock()
	f.cut = ch
	var drop []sharedHold
	if f.is("shared-frees-on-cut") {
		for h := range f.held {
			drop = append(drop, h)
		}
	}
	f.mu.Unlock()
	for _, h := range drop {
		_ = f.sh.ReleaseShared(context.Background(), h.key, h.mode, h.owner)
	}
	return func() {
		f.mu.Lock()
		f.cut = nil
		f.mu.Unlock()
		close(ch)
	}
}

func (f *flawedShared) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := f.gate(ctx); err != nil {
		return 0, err
	}
	return f.Locker.Acquire(ctx, key, owner, ttl)
}

func (f *flawedShared) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.Locker.Refresh(ctx, key, owner, ttl)
}

func (f *flawedShared) Release(ctx context.Context, key, owner string) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.Locker.Release(ctx, key, owner)
}

func (f *flawedShared) is(flaw string) bool { return f.st.flaw == flaw }

func (f *flawedShared) mode(m driver.SharedMode) driver.SharedMode {
	if f.is("shared-write-as-read") && m == driver.SharedWrite {
		return driver.SharedRead
	}
	return m
}

func (f *flawedShared) ttl(ttl time.Duration) time.Duration {
	if f.is("shared-never-expires") {
		return 1000 * ttl
	}
	return ttl
}

func (f *flawedShared) limit(key string, r driver.SharedRequest) int {
	n := r.Limit
	switch {
	case r.Mode != driver.SharedPermit:
	case f.is("shared-limit-plus-one"):
		n++
	case f.is("shared-limit-unchecked") && (n < 1 || n > driver.MaxSharedLimit):
		n = driver.MaxSharedLimit
	case f.is("shared-limit-max-seen"):
		f.st.mu.Lock()
		n = max(n, f.st.maxSeen[key])
		f.st.maxSeen[key] = n
		f.st.mu.Unlock()
	}
	return n
}

func (f *flawedShared) AcquireShared(ctx context.Context, key string, r driver.SharedRequest) (uint64, error) {
	if err := f.gate(ctx); err != nil {
		return 0, err
	}
	tok, err := f.acquireShared(ctx, key, r)
	if err == nil {
		f.mu.Lock()
		f.held[sharedHold{key, r.Owner, f.mode(r.Mode)}] = true
		f.mu.Unlock()
	}
	return tok, err
}

func (f *flawedShared) acquireShared(ctx context.Context, key string, r driver.SharedRequest) (uint64, error) {
	r.Mode, r.TTL, r.Limit = f.mode(r.Mode), f.ttl(r.TTL), f.limit(key, r)
	if f.is("shared-not-idempotent") && ctx.Err() == nil {
		hs, _ := f.sh.InspectShared(ctx, key, r.Mode)
		for _, h := range hs {
			if h.Owner == r.Owner {
				return 0, driver.ErrNotAcquired
			}
		}
	}
	var tok uint64
	var err error
	switch {
	case r.Wait && (f.is("shared-wait-polls") || (f.is("shared-writer-polls") && r.Mode == driver.SharedWrite)):
		tok, err = f.poll(ctx, key, r)
	case r.Wait && f.is("shared-cancel-stays-queued"):
		res := make(chan error, 1)
		go func() {
			var e error
			tok, e = f.sh.AcquireShared(context.WithoutCancel(ctx), key, r)
			res <- e
		}()
		select {
		case err = <-res:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	default:
		tok, err = f.sh.AcquireShared(ctx, key, r)
	}
	if err != nil && errors.Is(err, driver.ErrInvalid) && r.Wait && f.is("shared-upgrade-waits") {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	if err == nil && f.is("shared-namespace-mutex") {
		if _, merr := f.Locker.Acquire(ctx, key, r.Owner, r.TTL); merr != nil {
			_ = f.sh.ReleaseShared(ctx, key, r.Mode, r.Owner)
			return 0, merr
		}
	}
	if err == nil && f.is("shared-tokens-per-locker") {
		f.mu.Lock()
		id := key + "\x00" + r.Owner
		if f.tokens[id] == 0 {
			f.local++
			f.tokens[id] = f.local
		}
		tok = f.tokens[id]
		f.mu.Unlock()
	}
	return tok, err
}

// poll waits by one-shot requests: no queue entry, so no writer intent,
// and wake-ups only at the next poll.
func (f *flawedShared) poll(ctx context.Context, key string, r driver.SharedRequest) (uint64, error) {
	every := 5 * time.Millisecond
	if f.is("shared-wait-polls") {
		every = 1500 * time.Millisecond
	}
	r.Wait = false
	for {
		tok, err := f.sh.AcquireShared(ctx, key, r)
		if !errors.Is(err, driver.ErrNotAcquired) {
			return tok, err
		}
		select {
		case <-time.After(every):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (f *flawedShared) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	return f.sh.RefreshShared(ctx, key, f.mode(mode), owner, f.ttl(ttl))
}

func (f *flawedShared) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if err := f.gate(ctx); err != nil {
		return err
	}
	mode = f.mode(mode)
	f.mu.Lock()
	delete(f.held, sharedHold{key, owner, mode})
	f.mu.Unlock()
	hs, _ := f.sh.InspectShared(ctx, key, mode)
	switch {
	case f.is("shared-release-frees-all"):
		for _, h := range hs {
			if h.Owner != owner {
				_ = f.sh.ReleaseShared(ctx, key, h.Mode, h.Owner)
			}
		}
	case f.is("shared-release-any-owner") && len(hs) > 0:
		owner, mode = hs[0].Owner, hs[0].Mode
	}
	err := f.sh.ReleaseShared(ctx, key, mode, owner)
	if err == nil && f.is("shared-namespace-mutex") {
		_ = f.Locker.Release(ctx, key, owner)
	}
	return err
}

func (f *flawedShared) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := f.gate(ctx); err != nil {
		return nil, err
	}
	return f.sh.InspectShared(ctx, key, mode)
}
