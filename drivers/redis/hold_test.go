package redis

import (
	"testing"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/holdtest"
)

func openHold(t *testing.T, u string) *locker.Locker {
	t.Helper()
	l, err := locker.OpenURL(u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// A lock's key deleted or overwritten behind its holder's back closes
// Lost() within holdtest.Bound (100ms); the holder's own refreshes do not.
func TestHoldWatch(t *testing.T) {
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		holdtest.Run(t, func(t *testing.T) *locker.Locker { return openHold(t, urlOf(s.Addr)) }, holdtest.Single(s.Do))
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		u := urlOf(sn.Sentinel.Addr) + "?sentinel_master=" + sn.Name
		holdtest.Run(t, func(t *testing.T) *locker.Locker { return openHold(t, u) }, holdtest.Single(sn.Master.Do))
	})
}

// A lock key evicted under memory pressure (allow_eviction=true) closes
// Lost() within holdtest.Bound.
func TestHoldWatchEviction(t *testing.T) {
	holdtest.Evicted(t, openHold, func(addr string) string { return urlOf(addr) })
}

// The commands per acquire+release with hold watching: EVALSHA stays at 2;
// the watch adds one GET per grant on its own connection (INFO
// commandstats also counts the scripts' own GETs: 2 in acquire, 1 in
// release).
func TestHoldWatchCost(t *testing.T) {
	per := holdtest.Cost(t, func(t *testing.T, addr string) *locker.Locker { return openHold(t, urlOf(addr)) }, 50)
	t.Logf("commands per acquire+release: %v", per)
	if per["evalsha"] != 2 {
		t.Fatalf("EVALSHA per acquire+release = %v, want 2", per["evalsha"])
	}
	watch := per["get"] - 3
	t.Logf("watch GETs per acquire+release: %.2f", watch)
	if watch > 1.1 {
		t.Fatalf("watch GETs per acquire+release = %.2f, want about 1", watch)
	}
}

// A server restarted without persistence: the holder's Lost() closes
// within holdtest.LossBound of the server being back; another owner may be
// granted the key before that (the gap is logged; fencing tokens cover it).
func TestHoldWatchRestart(t *testing.T) {
	holdtest.Restarted(t, openHold, func(addr string) string { return urlOf(addr) })
}

// A Sentinel failover that loses the grant: as TestHoldWatchRestart.
func TestHoldWatchFailover(t *testing.T) {
	holdtest.FailedOver(t, openHold, func(addr string) string { return urlOf(addr) })
}
