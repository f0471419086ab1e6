package scaletest

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/etcdtest"
	"github.com/go-locker/locker/internal/pgtest"
	"github.com/go-locker/locker/internal/redistest"
)

func TestMain(m *testing.M) {
	if os.Getenv(envBackend) != "" {
		childMain()
	}
	os.Exit(m.Run())
}

// size is the run's size: reduced by default, full with LOCKER_SCALE=1.
func size() params {
	p := params{Locks: 500, Concurrency: 64, TTL: 3 * time.Second, Hold: 5 * time.Second}
	if os.Getenv("LOCKER_SCALE") == "1" {
		p.Locks, p.Hold = 10000, 30*time.Second
	}
	return p
}

// TestScale holds size().Locks locks with one Locker on a fresh default
// server of each backend, and asserts that none is refused and none lost.
// It logs the client's CPU per renewal and the server's commands per
// second over the hold window.
func TestScale(t *testing.T) {
	// One backend after the other: side by side, on a loaded 2-core
	// machine under -race, they measure the machine more than the driver.
	p := size()
	t.Run("etcd", func(t *testing.T) {
		c := etcdtest.Start(t)
		run(t, "etcd", c.URL(""), p, etcdRequests(c))
	})
	t.Run("postgres-lease", func(t *testing.T) {
		srv := pgtest.Start(t, "max_connections=100")
		run(t, "postgres-lease", srv.URL()+"&mode=lease", p, pgCommits(srv.URL()))
	})
	redisBackends := []string{"redis", "rueidis"}
	if os.Getenv("LOCKER_SCALE_UNBATCHED") == "1" {
		redisBackends = append(redisBackends, "redis-unbatched", "rueidis-unbatched")
	}
	for _, b := range redisBackends {
		t.Run(b, func(t *testing.T) {
			srv := redistest.Start(t)
			url := srv.URL()
			if strings.HasPrefix(b, "rueidis") {
				url = "rueidis://" + srv.Addr
			}
			run(t, b, url, p, redisCommands(srv.Addr))
		})
	}
}

// counterFunc reads a server's cumulative command count.
type counterFunc func() (int64, error)

// run starts the child on url and checks its result.
func run(t *testing.T, backend, url string, p params, commands counterFunc) {
	b, _ := json.Marshal(p)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envBackend+"="+backend, envURL+"="+url, envParams+"="+string(b))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var r *result
	var c0, c1 int64
	var t0, t1 time.Time
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == markHoldStart:
			c0, t0 = mustCount(t, commands), time.Now()
		case line == markHoldEnd:
			c1, t1 = mustCount(t, commands), time.Now()
		case strings.HasPrefix(line, markResult):
			r = new(result)
			if err := json.Unmarshal([]byte(line[len(markResult):]), r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := cmd.Wait(); err != nil || r == nil {
		t.Fatalf("client: %v (result %v)", err, r)
	}
	report(t, backend, p, r, float64(c1-c0)/t1.Sub(t0).Seconds())
}

func report(t *testing.T, backend string, p params, r *result, cmdsPerSec float64) {
	per := time.Duration(0)
	if r.Renewals > 0 {
		per = r.CPU / time.Duration(r.Renewals)
	}
	t.Logf("%s: %d locks, TTL %v, held %v: acquired %d, refused %d, lost %d (and %d after the window), release errors %d; "+
		"%d renewals (%d failed, %.0f/s), client CPU %v = %.1f%% of a core, %.1fµs per renewal; server %.0f commands/s",
		backend, p.Locks, p.TTL, r.Window.Round(time.Millisecond), r.Acquired, r.Refused, r.Lost, r.LostLate, r.ReleaseErrs,
		r.Renewals, r.RenewErrs, float64(r.Renewals)/r.Window.Seconds(), r.CPU.Round(time.Millisecond),
		100*r.CPU.Seconds()/r.Window.Seconds(), float64(per)/float64(time.Microsecond), cmdsPerSec)
	for _, e := range r.Errors {
		t.Log(e)
	}
	if r.Refused != 0 || r.Lost != 0 || r.LostLate != 0 || r.Acquired != p.Locks {
		t.Errorf("%s: %d of %d acquired, %d refused, %d lost; want all acquired, none refused or lost",
			backend, r.Acquired, p.Locks, r.Refused, r.Lost+r.LostLate)
	}
	// Every lock renews every TTL/3: fewer renewals than half of that
	// means renewals did not keep up (and the locks held only by luck).
	if want := int64(float64(p.Locks) * r.Window.Seconds() / (p.TTL / 3).Seconds()); r.Renewals < want/2 {
		t.Errorf("%s: %d renewals in %v, want about %d", backend, r.Renewals, r.Window, want)
	}
}

func mustCount(t *testing.T, f counterFunc) int64 {
	n, err := f()
	if err != nil {
		t.Errorf("server counter: %v", err)
	}
	return n
}

// etcdRequests counts the gRPC messages c's members received, as they
// serve their counters at /metrics: unary requests and keepalives on streams
// alike.
func etcdRequests(c *etcdtest.Cluster) counterFunc {
	return func() (int64, error) {
		mfs, err := c.Metrics(context.Background())
		if err != nil {
			return 0, err
		}
		var n float64
		for _, mf := range mfs {
			if mf.GetName() != "grpc_server_msg_received_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
		return int64(n), nil
	}
}

// pgCommits counts the server's committed transactions: every statement of
// the lease mode is one.
func pgCommits(url string) counterFunc {
	return func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, url)
		if err != nil {
			return 0, err
		}
		defer c.Close(ctx)
		// Counters of other sessions reach pg_stat_database within about a
		// second; the window is long enough for that to wash out.
		var n int64
		err = c.QueryRow(ctx, `SELECT sum(xact_commit)::bigint FROM pg_stat_database`).Scan(&n)
		return n, err
	}
}

// redisCommands reads INFO stats total_commands_processed.
func redisCommands(addr string) counterFunc {
	return func() (int64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c := goredis.NewClient(&goredis.Options{Addr: addr})
		defer c.Close()
		s, err := c.Info(ctx, "stats").Result()
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(s, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_commands_processed:"); ok {
				var n int64
				_, err := fmt.Sscan(v, &n)
				return n, err
			}
		}
		return 0, fmt.Errorf("no total_commands_processed in INFO stats")
	}
}
