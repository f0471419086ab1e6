package rueidis

import (
	"testing"

	"github.com/go-locker/locker/internal/redistest/holdtest"
)

// A lock's key deleted or overwritten behind its holder's back closes
// Lost() within holdtest.Bound (100ms); the holder's own refreshes do not;
// a killed watch connection is not a loss and is re-established.
// rueidis also watches Cluster.
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
