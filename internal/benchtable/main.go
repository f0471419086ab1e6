// Command benchtable reads the output of the benchmarks scripts/bench runs
// (go test -bench, several packages, -count N) on stdin and prints the
// README's performance tables as markdown: for each comparison, the median
// and the range over the N runs of a ratio to its floor. Absolute times are
// never printed: on a shared machine only ratios measured side by side
// mean anything.
//
//	go run ./internal/benchtable < bench.out
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	res, err := parse(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
	if missing := render(os.Stdout, res); len(missing) > 0 {
		fmt.Fprintln(os.Stderr, "benchtable: no results for:", strings.Join(missing, "; "))
		os.Exit(1)
	}
}

// results maps "pkg.BenchmarkName/sub" (GOMAXPROCS suffix dropped) and a
// unit to the values of every run, in order.
type results map[string]map[string][]float64

// parse reads go test -bench output. "pkg: " lines name the package of the
// benchmark lines that follow.
func parse(r io.Reader) (results, error) {
	res := results{}
	pkg := ""
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if p, ok := strings.CutPrefix(line, "pkg: "); ok {
			pkg = strings.TrimPrefix(strings.TrimSpace(p), "github.com/go-locker/locker")
			pkg = strings.TrimPrefix(pkg, "/")
			continue
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue // a name printed alone, before its result line
		}
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i]
			}
		}
		key := pkg + "." + name
		if res[key] == nil {
			res[key] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: value %q: %v", line, f[i], err)
			}
			res[key][f[i+1]] = append(res[key][f[i+1]], v)
		}
	}
	return res, sc.Err()
}

// row is one line of a table: a metric that is a ratio, or the ratio of
// two benchmarks' ns/op run one after the other (over, set).
type row struct {
	label, bench, unit string
	over               string // benchmark whose unit (overUnit if set) divides bench's, run by run
	overUnit           string
	plain              bool // a count, not a ratio: printed without "×"
}

type table struct {
	title string
	rows  []row
}

var tables = []table{
	{
		title: "Uncontended acquire+release against the floor (the raw client doing the same commands), interleaved in one loop",
		rows: []row{
			{label: "Redis (go-redis): driver / raw SET NX PX + release script", bench: "drivers/redis.BenchmarkAcquireReleaseInterleaved", unit: "driver/raw"},
			{label: "Redis (rueidis): driver / raw SET NX PX + release script", bench: "drivers/rueidis.BenchmarkUncontendedInterleaved", unit: "driver/floor"},
			{label: "Redis (rueidis): driver / raw rueidis running the driver's scripts", bench: "drivers/rueidis.BenchmarkUncontendedInterleaved", unit: "driver/same-scripts"},
			{label: "etcd: driver / raw txn put + delete", bench: "drivers/etcd.BenchmarkAcquireReleaseInterleaved", unit: "driver/raw"},
			{label: "PostgreSQL: driver / raw pg_advisory_lock + unlock", bench: "drivers/postgres.BenchmarkUncontendedInterleaved", unit: "driver/floor"},
			{label: "PostgreSQL: package locker / raw pg_advisory_lock + unlock", bench: "drivers/postgres.BenchmarkUncontendedInterleaved", unit: "locker/floor"},
		},
	},
	{
		title: "Shared holds against the same backend's mutex (uncontended acquire+release of a semaphore permit and of a read lock, beside the mutex's), interleaved in one loop",
		rows: []row{
			{label: "etcd: semaphore permit / mutex", bench: "drivers/etcd.BenchmarkSharedInterleaved", unit: "permit/mutex"},
			{label: "etcd: read lock / mutex", bench: "drivers/etcd.BenchmarkSharedInterleaved", unit: "read/mutex"},
		},
	},
	{
		title: "File driver against its system calls (run one after the other, not interleaved)",
		rows: []row{
			{label: "file: driver / raw open+flock+read+write", bench: "drivers/file.BenchmarkAcquireRelease", unit: "ns/op", over: "drivers/file.BenchmarkRawSyscalls"},
			{label: "file: package locker / raw open+flock+read+write", bench: "drivers/file.BenchmarkLockerAcquireRelease", unit: "ns/op", over: "drivers/file.BenchmarkRawSyscalls"},
		},
	},
	{
		title: "Semaphores and read-write locks against the same backend's mutex (acquire+release, uncontended), interleaved in one loop",
		rows: []row{
			{label: "Redis (go-redis): semaphore permit / mutex", bench: "drivers/redis.BenchmarkSharedInterleaved", unit: "permit/mutex"},
			{label: "Redis (go-redis): read lock / mutex", bench: "drivers/redis.BenchmarkSharedInterleaved", unit: "read/mutex"},
			{label: "Redis (rueidis): semaphore permit / mutex", bench: "drivers/rueidis.BenchmarkSharedInterleaved", unit: "permit/mutex"},
			{label: "Redis (rueidis): read lock / mutex", bench: "drivers/rueidis.BenchmarkSharedInterleaved", unit: "read/mutex"},
		},
	},
	{
		title: "OpenTelemetry overhead on mem's acquire+release (default global providers, no SDK), rotating blocks in one benchmark",
		rows: []row{
			{label: "mem: with OpenTelemetry / without", bench: ".BenchmarkTelemetryOverhead", unit: "ratio"},
			{label: "mem: control (a second copy without) / without", bench: ".BenchmarkTelemetryOverhead", unit: "control-ratio"},
		},
	},
	{
		title: "Redis libraries against the raw go-redis floor (bench/redis module), interleaved in one loop",
		rows: []row{
			{label: "locker's Redis driver", bench: "bench/redis.BenchmarkInterleaved", unit: "driver/raw"},
			{label: "package locker (TryAcquire + Release, no auto-renew)", bench: "bench/redis.BenchmarkInterleaved", unit: "locker/raw"},
			{label: "bsm/redislock", bench: "bench/redis.BenchmarkInterleaved", unit: "bsm/raw"},
			{label: "go-redsync", bench: "bench/redis.BenchmarkInterleaved", unit: "redsync/raw"},
		},
	},
	queueTable(),
	contentionTable(),
	electionTable(),
}

// electionTable is cmd/locker's BenchmarkElection, per backend: failover
// after a crash over the TTL, after a resign over the mutex handoff
// measured in the same run, and Observe's latency (absolute: the bound it
// is held to, 100ms, is).
func electionTable() table {
	t := table{title: "Leader election (cmd/locker BenchmarkElection): failover after the leader's process is killed (SIGKILL) over the TTL, failover after a resign over the same backend's mutex handoff (interleaved), and an observer's latency from a grant to Observe yielding it, in ms"}
	for _, be := range []struct{ name, label string }{
		{"file", "file"},
		{"redis", "Redis (go-redis)"},
		{"rueidis", "Redis (rueidis)"},
		{"etcd", "etcd"},
		{"postgres", "PostgreSQL advisory"},
		{"postgres-lease", "PostgreSQL lease"},
	} {
		b := "cmd/locker.BenchmarkElection/" + be.name
		t.rows = append(t.rows,
			row{label: be.label + ": crash failover / TTL", bench: b, unit: "failover/ttl"},
			row{label: be.label + ": resign failover / mutex handoff", bench: b, unit: "resign/handoff"},
			row{label: be.label + ": Observe latency p50 (ms)", bench: b, unit: "observe-p50-ms", plain: true},
			row{label: be.label + ": Observe latency max (ms)", bench: b, unit: "observe-max-ms", plain: true},
		)
	}
	return t
}

// queueTable is the Redis fair queue (go-redis): one handoff interleaved
// with the floor's (BenchmarkHandoffFair), then under contention
// (BenchmarkQueue's fair runs and BenchmarkHandoffFloor in the same run).
func queueTable() table {
	t := table{title: "Redis fair queue (go-redis; separate Lockers as separate processes, 5ms hold): one handoff to one queued waiter interleaved with the raw pub/sub handoff floor; then under contention, in the steady state, client calls and fairness per acquisition and wake p50 over the floor's p50 run beside it"}
	t.rows = append(t.rows, row{label: "1 waiter: handoff p50 / floor's p50, interleaved", bench: "drivers/redis.BenchmarkHandoffFair", unit: "fair/floor"})
	for _, n := range []string{"8", "32", "64"} {
		b := "drivers/redis.BenchmarkQueue/fair-" + n
		t.rows = append(t.rows,
			row{label: n + " processes: client calls per acquisition", bench: b, unit: "calls/acq", plain: true},
			row{label: n + " processes: fairness (fewest / most acquisitions of one Locker)", bench: b, unit: "fairness", plain: true},
			row{label: n + " processes: wake p50 / floor's p50", bench: b, unit: "wake-p50-us", over: "drivers/redis.BenchmarkHandoffFloor", overUnit: "handoff-p50-us"},
		)
	}
	for _, n := range []string{"8", "32", "64"} {
		b := "drivers/redis.BenchmarkQueue/sem4-" + n
		t.rows = append(t.rows,
			row{label: n + " processes, semaphore of 4: client calls per acquisition", bench: b, unit: "calls/acq", plain: true},
			row{label: n + " processes, semaphore of 4: fairness", bench: b, unit: "fairness", plain: true},
			row{label: n + " processes, semaphore of 4: wake p50 / the mutex's wake p50 at " + n, bench: b, unit: "wake-p50-us", over: "drivers/redis.BenchmarkQueue/fair-" + n, overUnit: "wake-p50-us"},
		)
	}
	return t
}

// contentionTable is a semaphore of 4 under contention on etcd,
// PostgreSQL and file (each driver's BenchmarkContention), beside the same
// backend's mutex in the same run.
func contentionTable() table {
	t := table{title: "Semaphore of 4 under contention beside the same backend's mutex (BenchmarkContention; separate Lockers as separate processes, 5ms hold): client calls per acquisition (etcd: requests and stream messages; PostgreSQL: statements; file: flock attempts), fairness, and wake p50 over the mutex's in the same run"}
	for _, be := range []struct{ label, bench string }{
		{"etcd", "drivers/etcd.BenchmarkContention/"},
		{"PostgreSQL advisory", "drivers/postgres.BenchmarkContention/advisory-"},
		{"PostgreSQL lease", "drivers/postgres.BenchmarkContention/lease-"},
		{"file", "drivers/file.BenchmarkContention/"},
	} {
		for _, n := range []string{"8", "32", "64"} {
			sem, mutex := be.bench+"sem4-"+n, be.bench+"mutex-"+n
			p := be.label + ", " + n + " processes: "
			t.rows = append(t.rows,
				row{label: p + "permit's client calls per acquisition", bench: sem, unit: "calls/acq", plain: true},
				row{label: p + "mutex's client calls per acquisition", bench: mutex, unit: "calls/acq", plain: true},
				row{label: p + "permit fairness", bench: sem, unit: "fairness", plain: true},
				row{label: p + "permit wake p50 / mutex's wake p50", bench: sem, unit: "wake-p50-us", over: mutex, overUnit: "wake-p50-us"},
			)
		}
	}
	return t
}

// values returns the ratios of r, one per run.
func (r row) values(res results) []float64 {
	v := res[r.bench][r.unit]
	if r.over == "" {
		return v
	}
	u := r.unit
	if r.overUnit != "" {
		u = r.overUnit
	}
	d := res[r.over][u]
	var out []float64
	for i := range min(len(v), len(d)) {
		if d[i] != 0 {
			out = append(out, v[i]/d[i])
		}
	}
	return out
}

// render prints the tables and returns the rows that had no results.
func render(w io.Writer, res results) (missing []string) {
	for _, t := range tables {
		fmt.Fprintf(w, "\n%s:\n\n| | median | range | runs |\n|---|---|---|---|\n", t.title)
		for _, r := range t.rows {
			v := r.values(res)
			if len(v) == 0 {
				missing = append(missing, r.label)
				fmt.Fprintf(w, "| %s | – | – | 0 |\n", r.label)
				continue
			}
			lo, hi := slices.Min(v), slices.Max(v)
			x := "×"
			if r.plain {
				x = ""
			}
			fmt.Fprintf(w, "| %s | %.2f%s | %.2f–%.2f%s | %d |\n", r.label, median(v), x, lo, hi, x, len(v))
		}
	}
	return missing
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
