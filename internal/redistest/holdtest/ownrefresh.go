package holdtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// OwnRefreshReads runs ownRefreshReads on a single server, a Sentinel
// master and a 3-master Cluster; of spells the driver's URL.
func OwnRefreshReads(t *testing.T, of func(addrs ...string) string) {
	s := redistest.Start(t)
	ownRefreshReads(t, of(s.Addr), []string{s.Addr}, Single(s.Do))
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		u := drivertest.With(of(sn.Sentinel.Addr), "sentinel_master="+sn.Name)
		ownRefreshReads(t, u, []string{sn.Master.Addr}, Single(sn.Master.Do))
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		u := drivertest.With(of(c.Addrs()...), "cluster=true")
		ownRefreshReads(t, u, redistest.Addrs(c.Masters), Cluster(c.Masters))
	})
}

// ownRefreshReads asserts that the holder's own refreshes cost the hold
// watch nothing on a Locker opened on url, counted by the servers at addrs
// (MONITOR, script internals left out; at names the server of a key, as
// for Run): once the watch has
// armed, refreshes of a package-level Lock, one by one and in a
// driver.BatchRefresher batch, are one EVALSHA each and nothing else, so
// the watch sends no GET after them; and the key is still watched: a DEL
// from another client afterwards closes Lost() within Bound,
// after which the watch's one GET (the read that finds the key gone) is
// the only one.
func ownRefreshReads(t *testing.T, url string, addrs []string, at func(string) Do) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l := drivertest.Open(t, url)
	const owner = "own-refresh-reads"
	lk, err := l.TryAcquire(ctx, "k", locker.WithTTL(30*time.Second), locker.WithOwner(owner))
	if err != nil {
		t.Fatal(err)
	}
	const lock = "locker:{k}"
	drivertest.WaitWatched(t, at(lock), "k") // the watch's first read has run
	br, ok := l.Driver().(driver.BatchRefresher)
	if !ok {
		t.Fatal("the driver is no driver.BatchRefresher")
	}
	items := []driver.RefreshItem{{Key: "k", Owner: owner, TTL: 30 * time.Second}, {Key: "free", Owner: owner, TTL: 30 * time.Second}}
	// Warm up: the refresh script loaded on every server the batch reaches
	// (its first run there is EVALSHA, NOSCRIPT, then EVAL).
	if errs := br.RefreshBatch(ctx, items); errs[0] != nil {
		t.Fatal(errs[0])
	}
	ms := make([]*drivertest.Monitor, len(addrs))
	for i, a := range addrs {
		ms[i] = drivertest.StartMonitor(t, a)
	}
	take := func() []string {
		var all []string
		for _, m := range ms {
			all = append(all, m.Take(t)...)
		}
		return all
	}
	take()
	const refreshes = 5
	for range refreshes {
		if err := lk.Refresh(ctx, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	errs := br.RefreshBatch(ctx, items)
	if errs[0] != nil || !errors.Is(errs[1], driver.ErrNotHeld) {
		t.Fatalf("batch: %v, want nil and ErrNotHeld", errs)
	}
	got := take()
	if want := refreshes + len(items); len(got) != want || countOf(got, "evalsha") != want {
		t.Fatalf("%d refreshes and a batch of %d: the server got %v, want %d EVALSHA and nothing else", refreshes, len(items), got, want)
	}
	start := time.Now()
	if _, err := at(lock)("DEL", lock); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("Lost() still open 5s after the DEL: the refreshes left the key unwatched")
	}
	if gap := time.Since(start); gap > Bound {
		t.Fatalf("Lost() closed %v after the DEL, want within %v", gap, Bound)
	}
	got = take()
	if countOf(got, "get") != 1 {
		t.Fatalf("after the DEL the server got %v, want one GET (the watch's read that finds the key gone)", got)
	}
	t.Logf("after the DEL: %v", got)
}

// countOf counts name in cmds.
func countOf(cmds []string, name string) int {
	n := 0
	for _, c := range cmds {
		if c == name {
			n++
		}
	}
	return n
}

// ExpiredByOwnRefresh asserts that a refresh whose own read expires the
// lock key (active expiry off, so the key stays until read) makes the
// hold watch report the grant lost, although the server sends the
// refreshing connection no invalidation for it when that connection tracks
// with NOLOOP. of builds the driver's URL of a server's address.
func ExpiredByOwnRefresh(t *testing.T, of func(addrs ...string) string) {
	s := redistest.Start(t, "--enable-debug-command", "yes")
	if _, err := s.Do("DEBUG", "SET-ACTIVE-EXPIRE", "0"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := drivertest.Open(t, of(s.Addr)).Driver()
	w, ok := d.(driver.HoldWatcher)
	if !ok {
		t.Fatal("the driver is no driver.HoldWatcher")
	}
	const ttl = 100 * time.Millisecond
	tok, err := d.Acquire(ctx, "gone", "o", ttl)
	if err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(ttl)
	lost := make(chan error, 1)
	stop, err := w.WatchHold("gone", "o", tok, func(err error) { lost <- err })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	drivertest.WaitWatched(t, s.Do, "gone")
	// The wait is for the server's clock to pass the TTL, not for an event:
	// nothing happens on the server when it does.
	time.Sleep(time.Until(expires) + 20*time.Millisecond)
	if err := d.Refresh(ctx, "gone", "o", 30*time.Second); !errors.Is(err, driver.ErrNotHeld) {
		t.Fatalf("refresh of an expired key: %v, want ErrNotHeld", err)
	}
	select {
	case err := <-lost:
		if !errors.Is(err, driver.ErrNotHeld) {
			t.Fatalf("hold watch: %v, want ErrNotHeld", err)
		}
	case <-time.After(time.Second):
		t.Fatal("the hold watch did not report the grant within 1s of the refresh that expired it")
	}
}
