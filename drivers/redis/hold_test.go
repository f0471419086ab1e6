package redis

import (
	"context"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
	"github.com/go-locker/locker/internal/redistest/holdtest"
)

// A lock's key deleted or overwritten behind its holder's back closes
// Lost() within holdtest.Bound (100ms); the holder's own refreshes do not;
// a killed watch connection is not a loss and is re-established.
// go-redis watches single servers, Cluster masters and Sentinel masters.
func TestHoldWatch(t *testing.T) { holdtest.Modes(t, urlOf, true) }

// A lock key evicted under memory pressure (allow_eviction=true) closes
// Lost() within holdtest.Bound.
func TestHoldWatchEviction(t *testing.T) { holdtest.Evicted(t, urlOf) }

// A server restarted without persistence: Lost() closes within
// holdtest.LossBound of the server being back (the gap to another owner's
// grant is logged).
func TestHoldWatchRestart(t *testing.T) { holdtest.Restarted(t, urlOf) }

// A Sentinel failover that loses the grant: as TestHoldWatchRestart.
func TestHoldWatchFailover(t *testing.T) { holdtest.FailedOver(t, urlOf) }

// Acquire+release stays two EVALSHA; the watch adds one GET per grant.
func TestHoldWatchCost(t *testing.T) { holdtest.CheckCost(t, urlOf) }

// A Locker watching a key's changes (driver.ChangeWatcher) hears each
// grant, release and expiry made elsewhere.
func TestWatchChanges(t *testing.T) { holdtest.Changes(t, urlOf) }

// The holder's own refreshes, one by one and batched, send the server one
// EVALSHA each and the hold watch no GET, and leave the key watched, on a
// single server, a Sentinel master and a Cluster.
func TestHoldWatchOwnRefreshReads(t *testing.T) { holdtest.OwnRefreshReads(t, urlOf) }

// A refresh whose own read expires the key has the hold watch report it.
func TestHoldWatchExpiredByOwnRefresh(t *testing.T) { holdtest.ExpiredByOwnRefresh(t, urlOf) }

// A refresh whose tracking client fails under it (here closed, as when a
// reconnected subscriber has it replaced) runs again on the Locker's own
// client and succeeds (retryElsewhere): a broken tracking connection costs
// no renewal.
func TestTrackedRefreshFallsBack(t *testing.T) {
	s := redistest.Start(t)
	l := drivertest.Open(t, urlOf(s.Addr))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(30*time.Second), locker.WithOwner("o"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "k2", locker.WithTTL(30*time.Second), locker.WithOwner("o")); err != nil {
		t.Fatal(err)
	}
	drivertest.WaitWatched(t, s.Do, "k")
	tr := l.Driver().(*Locker).tr
	trk := tr.refreshClient(ctx, "locker:{k}")
	if trk == nil {
		t.Fatal("no tracking client runs the refreshes")
	}
	if err := trk.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lk.Refresh(ctx, 30*time.Second); err != nil {
		t.Fatalf("refresh with its tracking client closed: %v", err)
	}
	errs := l.Driver().(driver.BatchRefresher).RefreshBatch(ctx, []driver.RefreshItem{{Key: "k", Owner: "o", TTL: 30 * time.Second}, {Key: "k2", Owner: "o", TTL: 30 * time.Second}})
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("batch refresh with the tracking client closed: %v", errs)
	}
}
