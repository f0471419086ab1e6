// Package holdtest holds the hold-watching scenarios both Redis drivers
// run against real servers: a lock's key deleted, overwritten or evicted
// behind its holder's back must close Lost() promptly, and the holder's own
// refreshes must not.
package holdtest

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// Bound is the longest time allowed between a change made on the server
// and the holder's Lost() closing.
const Bound = 100 * time.Millisecond

// Do runs one command on the server that holds the keys (the single
// server, the Sentinel master).
type Do func(args ...string) (any, error)

// Run runs the scenarios on the Locker open returns; at(key) reaches the
// server holding key behind the Locker's back.
func Run(t *testing.T, open func(t *testing.T) *locker.Locker, at func(key string) Do) {
	l := open(t)
	ctx := context.Background()
	acquire := func(t *testing.T, key string, ttl time.Duration) *locker.Lock {
		t.Helper()
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lk.Release(ctx) })
		return lk
	}
	lockKey := func(key string) string { k, _, _ := rediscore.Keys(rediscore.DefaultPrefix, key); return k }

	t.Run("deleted", func(t *testing.T) {
		lk := acquire(t, "hold-deleted", 10*time.Second)
		do := at(lockKey("hold-deleted"))
		drivertest.WaitWatched(t, do, lockKey("hold-deleted"))
		changed(t, lk, func() {
			if _, err := do("DEL", lockKey("hold-deleted")); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("overwritten", func(t *testing.T) {
		lk := acquire(t, "hold-overwritten", 10*time.Second)
		do := at(lockKey("hold-overwritten"))
		drivertest.WaitWatched(t, do, lockKey("hold-overwritten"))
		changed(t, lk, func() {
			v := strconv.FormatUint(lk.Token()+1, 10) + ":someone-else"
			if _, err := do("SET", lockKey("hold-overwritten"), v, "PX", "10000"); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("own refreshes", func(t *testing.T) {
		// TTL 300ms: auto-renewal every 100ms, about 10 renewals in a
		// second, plus explicit refreshes; none may close Lost().
		lk := acquire(t, "hold-refreshed", 300*time.Millisecond)
		do := at(lockKey("hold-refreshed"))
		for range 5 {
			if err := lk.Refresh(ctx, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		select {
		case <-lk.Lost():
			t.Fatalf("Lost() closed during the holder's own renewals: %v", lk.Err())
		case <-time.After(time.Second):
		}
		// Still watched after all those invalidations.
		drivertest.WaitWatched(t, do, lockKey("hold-refreshed"))
		changed(t, lk, func() {
			if _, err := do("DEL", lockKey("hold-refreshed")); err != nil {
				t.Fatal(err)
			}
		})
	})
	t.Run("watch connection killed", func(t *testing.T) {
		// Every client connection is killed (the watch's, the Locker's):
		// a broken watch is not a lost lock. Once the watch is back, a
		// deletion is caught as before.
		lk := acquire(t, "hold-reconnect", 10*time.Second)
		do := at(lockKey("hold-reconnect"))
		drivertest.WaitWatched(t, do, lockKey("hold-reconnect"))
		killClients(t, do)
		select {
		case <-lk.Lost():
			t.Fatalf("Lost() closed after the watch connection was killed, the lock still held: %v", lk.Err())
		case <-time.After(500 * time.Millisecond):
		}
		waitTracking(t, do)
		changed(t, lk, func() {
			if _, err := do("DEL", lockKey("hold-reconnect")); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// killClients kills every client connection on the server except the
// Sentinel's own links and replication links: killing a Sentinel's links
// can make it fail the master over (down-after 1s), which is a different
// fault from the one under test.
func killClients(t *testing.T, do Do) {
	t.Helper()
	v, err := do("CLIENT", "LIST")
	if err != nil {
		t.Fatal(err)
	}
	s, _ := v.(string)
	killed := 0
	for _, line := range strings.Split(s, "\n") {
		f := clientFields(line)
		if f["id"] == "" || strings.HasPrefix(f["name"], "sentinel-") ||
			strings.ContainsAny(f["flags"], "MS") || f["cmd"] == "client|list" {
			continue
		}
		if _, err := do("CLIENT", "KILL", "ID", f["id"]); err != nil {
			t.Fatalf("CLIENT KILL ID %s: %v", f["id"], err)
		}
		killed++
	}
	if killed == 0 {
		t.Fatalf("no client connection to kill: %s", s)
	}
}

// clientFields splits one CLIENT LIST line into its key=value fields.
func clientFields(line string) map[string]string {
	f := map[string]string{}
	for _, kv := range strings.Fields(line) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			f[k] = v
		}
	}
	return f
}

// waitTracking waits until some client connection has tracking on again
// (CLIENT LIST flag t).
func waitTracking(t *testing.T, do Do) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		v, err := do("CLIENT", "LIST")
		if s, _ := v.(string); err == nil && strings.Contains(s, "flags=t") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tracking connection 10s after the kill: %v", v)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition with a deadline
	}
}

// Modes runs Run on a single server and a Sentinel master, and on a
// Cluster when cluster is true; of spells the driver's URL.
func Modes(t *testing.T, of func(addrs ...string) string, cluster bool) {
	t.Run("single", func(t *testing.T) {
		s := redistest.Start(t)
		Run(t, func(t *testing.T) *locker.Locker { return drivertest.Open(t, of(s.Addr)) }, Single(s.Do))
	})
	t.Run("sentinel", func(t *testing.T) {
		sn := redistest.StartSentinel(t)
		u := drivertest.With(of(sn.Sentinel.Addr), "sentinel_master="+sn.Name)
		Run(t, func(t *testing.T) *locker.Locker { return drivertest.Open(t, u) }, Single(sn.Master.Do))
	})
	if cluster {
		t.Run("cluster", func(t *testing.T) {
			c := redistest.StartCluster(t, 3)
			u := drivertest.With(of(c.Addrs()...), "cluster=true")
			Run(t, func(t *testing.T) *locker.Locker { return drivertest.Open(t, u) }, Cluster(c.Masters))
		})
	}
}

// CheckCost runs Cost and fails unless acquire+release stays two EVALSHA
// and the watch adds about one GET per grant (INFO commandstats also
// counts the scripts' own GETs: 2 in acquire, 1 in release).
func CheckCost(t *testing.T, of func(addrs ...string) string) {
	per := Cost(t, of, 50)
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

// Single returns Run's at for one server (or a Sentinel master).
func Single(do Do) func(string) Do { return func(string) Do { return do } }

// Cluster returns Run's at for a Cluster: the master serving the key.
func Cluster(masters []*redistest.Server) func(string) Do {
	return func(key string) Do {
		for _, m := range masters {
			if _, err := m.Do("EXISTS", key); err == nil {
				return m.Do
			}
		}
		return masters[0].Do
	}
}

// changed runs change and asserts that lk's Lost() closes within Bound of
// its return, with cause server.
func changed(t *testing.T, lk *locker.Lock, change func()) {
	t.Helper()
	change()
	lostWithin(t, lk, time.Now(), "the change")
}

// lostWithin asserts that lk's Lost() closes, with cause server, within
// Bound of at (when what happened).
func lostWithin(t *testing.T, lk *locker.Lock, at time.Time, what string) {
	t.Helper()
	select {
	case <-lk.Lost():
	case <-time.After(5 * time.Second):
		t.Fatalf("Lost() still open 5s after %s", what)
	}
	gap := time.Since(at)
	if !errors.Is(lk.Err(), locker.CauseServer) {
		t.Fatalf("lk.Err() = %v, want cause server", lk.Err())
	}
	t.Logf("Lost() closed %v after %s", gap, what)
	if gap > Bound {
		t.Fatalf("Lost() closed %v after %s, want within %v", gap, what, Bound)
	}
}

// Evicted starts a server with maxmemory-policy allkeys-lru and a small
// maxmemory, opens a Locker on it with allow_eviction=true (open gets its
// URL), takes a lock, and fills the server until the lock key is evicted:
// the holder's Lost() must close within Bound of the eviction being
// observed.
func Evicted(t *testing.T, of func(addrs ...string) string) {
	s := redistest.Start(t, "--maxmemory-policy", "allkeys-lru", "--maxmemory-samples", "10")
	v, err := s.Do("INFO", "memory")
	if err != nil {
		t.Fatal(err)
	}
	used := 0
	if str, _ := v.(string); str != "" {
		used = drivertest.InfoInt(str, "used_memory:")
	}
	if _, err := s.Do("CONFIG", "SET", "maxmemory", strconv.Itoa(used+2<<20)); err != nil {
		t.Fatal(err)
	}
	l := drivertest.Open(t, drivertest.With(of(s.Addr), "allow_eviction=true"))
	ctx := context.Background()
	lk, err := l.TryAcquire(ctx, "evicted", locker.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	key, _, _ := rediscore.Keys(rediscore.DefaultPrefix, "evicted")
	drivertest.WaitWatched(t, s.Do, key)
	filler := string(make([]byte, 16<<10))
	var at time.Time
	for i := 0; ; i++ {
		if _, err := s.Do("SET", "filler:"+strconv.Itoa(i), filler); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.Do("EXISTS", key); v == int64(0) {
			at = time.Now()
			break
		}
		if i > 100000 {
			t.Fatal("the lock key was never evicted")
		}
	}
	lostWithin(t, lk, at, "the eviction was observed")
}

// Cost acquires and releases n locks through the Locker open returns
// (on a fresh server at the address it is given) and reports the commands
// the server ran per acquire+release, by name, from INFO commandstats.
// Hold watching adds reads (GET) of the lock key on the watch connection;
// the acquire and release themselves stay one EVALSHA each. Each grant is
// of its own key: the invalidation a release's DEL sends can reach the
// client after the next grant of the same key is watched, and costs that
// grant one more GET (a stale mark is read, never ignored).
func Cost(t *testing.T, of func(addrs ...string) string, n int) map[string]float64 {
	s := redistest.Start(t)
	l := drivertest.Open(t, of(s.Addr))
	ctx := context.Background()
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		key := "cost-" + strconv.Itoa(i)
		lk, err := l.TryAcquire(ctx, key, locker.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		drivertest.WaitWatched(t, s.Do, key)
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	v, err := s.Do("INFO", "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(v.(string), "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, _ := strconv.Atoi(calls)
		out[strings.TrimPrefix(name, "cmdstat_")] = float64(c) / float64(n)
	}
	return out
}

// Restarted takes a lock on a server without persistence, restarts the
// server empty, and has another owner try for the key from the moment the
// server is back. The holder's Lost() must close (cause server) within
// LossBound of the server being back. It returns when Lost() closed and
// when the other owner was granted, both measured from the restart's end.
func Restarted(t *testing.T, of func(addrs ...string) string) (lost, granted time.Duration) {
	s := redistest.Start(t)
	u := of(s.Addr)
	return afterLoss(t, drivertest.Open(t, u), drivertest.Open(t, u), "restarted", s.Do, func() {}, s.Restart)
}

// FailedOver takes a lock on a Sentinel master whose replica replicates
// through a fault proxy, blackholed before the grant, so the grant never
// reaches the replica; then it kills the master, and the sentinel promotes
// the replica: the failover loses the grant. As Restarted, measured from
// the promotion being observed.
func FailedOver(t *testing.T, of func(addrs ...string) string) (lost, granted time.Duration) {
	sn := redistest.StartSentinel(t)
	p, err := faultproxy.New(sn.Master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	_, port, _ := strings.Cut(p.Addr(), ":")
	if _, err := sn.Replica.Do("REPLICAOF", "127.0.0.1", port); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, _ := sn.Replica.Do("INFO", "replication")
		if s, _ := v.(string); strings.Contains(s, "master_link_status:up") && strings.Contains(s, "master_port:"+port) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica did not sync through the proxy: %v", v)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	u := drivertest.With(of(sn.Sentinel.Addr), "sentinel_master="+sn.Name)
	holder, other := drivertest.Open(t, u), drivertest.Open(t, u)
	return afterLoss(t, holder, other, "failed-over", sn.Master.Do, p.Blackhole, func() {
		sn.Master.Kill()
		deadline := time.Now().Add(60 * time.Second)
		for {
			if v, err := sn.Replica.Do("ROLE"); err == nil {
				if a, _ := v.([]any); len(a) > 0 && a[0] == "master" {
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatal("the replica was not promoted within 60s")
			}
			time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
		}
	})
}

// LossBound is the longest time allowed between the server being back
// without the lock (restarted empty, failed over) and the holder's Lost().
const LossBound = 3 * time.Second

func afterLoss(t *testing.T, holder, other *locker.Locker, key string, do Do, before, loseIt func()) (lost, granted time.Duration) {
	ctx := context.Background()
	before()
	lk, err := holder.TryAcquire(ctx, key, locker.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Release(ctx)
	k, _, _ := rediscore.Keys(rediscore.DefaultPrefix, key)
	drivertest.WaitWatched(t, do, k)
	loseIt()
	back := time.Now()
	type grant struct {
		at    time.Time
		token uint64
	}
	grantedAt := make(chan grant, 1)
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			c, cancel := context.WithTimeout(ctx, time.Second)
			lk2, err := other.TryAcquire(c, key, locker.WithTTL(30*time.Second), locker.WithAutoRenew(false))
			cancel()
			if err == nil {
				grantedAt <- grant{time.Now(), lk2.Token()}
				_ = lk2.Release(ctx)
				return
			}
			time.Sleep(time.Millisecond) // retrying an attempt, bounded by the deadline
		}
		grantedAt <- grant{}
	}()
	select {
	case <-lk.Lost():
	case <-time.After(30 * time.Second):
		t.Fatal("Lost() still open 30s after the server lost the lock")
	}
	lost = time.Since(back)
	if !errors.Is(lk.Err(), locker.CauseServer) {
		t.Fatalf("lk.Err() = %v, want cause server", lk.Err())
	}
	g := <-grantedAt
	if g.at.IsZero() {
		t.Fatal("the other owner was never granted the key")
	}
	// The server lost the grant and its token counter with it: the
	// server-TIME floor still makes the next token larger.
	if g.token <= lk.Token() {
		t.Fatalf("token %d granted after the server lost the lock, want > %d", g.token, lk.Token())
	}
	granted = g.at.Sub(back)
	t.Logf("server back without the lock: holder's Lost() after %v, other owner granted after %v", lost, granted)
	if lost > LossBound {
		t.Fatalf("Lost() closed %v after the server was back without the lock, want within %v", lost, LossBound)
	}
	return lost, granted
}
