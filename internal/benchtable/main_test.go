package main

import (
	"strings"
	"testing"
)

const sample = `goos: linux
pkg: github.com/go-locker/locker/drivers/redis
BenchmarkAcquireReleaseInterleaved-2   	    5000	    220000 ns/op	    100000 raw-ns	    110000 driver-ns	         1.10 driver/raw	    1200 B/op	      30 allocs/op
BenchmarkAcquireReleaseInterleaved-2   	    5000	    220000 ns/op	    100000 raw-ns	    120000 driver-ns	         1.20 driver/raw
BenchmarkAcquireReleaseInterleaved-2   	    5000	    220000 ns/op	    100000 raw-ns	    105000 driver-ns	         1.05 driver/raw
ok  	github.com/go-locker/locker/drivers/redis	10.1s
pkg: github.com/go-locker/locker/drivers/file
BenchmarkAcquireRelease
BenchmarkAcquireRelease-2   	   10000	     30000 ns/op
BenchmarkRawSyscalls-2      	   10000	     20000 ns/op
pkg: github.com/go-locker/locker/drivers/redis
BenchmarkHandoffFloor-2   	     400	   5552666 ns/op	       250.0 handoff-p50-us	       265.3 handoff-us
BenchmarkHandoffFair-2   	     400	  12593953 ns/op	       683.0 fair-p50-us	         1.697 fair/floor	       402.0 floor-p50-us
BenchmarkQueue/fair-8-2   	     400	   6028804 ns/op	         3.998 calls/acq	         1.000 fairness	        27.00 server-cmds/acq	       500.0 wake-p50-us
pkg: github.com/go-locker/locker/drivers/postgres
BenchmarkContention/lease-mutex-8-2   	     400	   6028804 ns/op	         6.000 calls/acq	         1.000 fairness	       800.0 wake-p50-us
BenchmarkContention/lease-sem4-8-2   	     400	   1528804 ns/op	         5.000 calls/acq	         0.9000 fairness	       1200 wake-p50-us
pkg: github.com/go-locker/locker/cmd/locker
BenchmarkElection/etcd-2         	       5	2444521047 ns/op	         1.121 failover-max/ttl	         1.118 failover/ttl	         3.835 handoff-p50-ms	        25.09 observe-max-ms	         2.810 observe-p50-ms	         3.919 resign-p50-ms	         1.022 resign/handoff
BenchmarkElection/postgres-lease-2         	       5	1234461265 ns/op	         0.9698 failover-max/ttl	         0.9153 failover/ttl	         3.262 handoff-p50-ms	        45.89 observe-max-ms	        37.71 observe-p50-ms	         4.208 resign-p50-ms	         1.290 resign/handoff
`

func TestParseAndRender(t *testing.T) {
	res, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if got := res["drivers/redis.BenchmarkAcquireReleaseInterleaved"]["driver/raw"]; len(got) != 3 || got[1] != 1.20 {
		t.Fatalf("driver/raw = %v", got)
	}
	var b strings.Builder
	missing := render(&b, res)
	out := b.String()
	for _, want := range []string{
		"| Redis (go-redis): driver / raw SET NX PX + release script | 1.10× | 1.05–1.20× | 3 |",
		"| file: driver / raw open+flock+read+write | 1.50× | 1.50–1.50× | 1 |",
		"| 8 processes: client calls per acquisition | 4.00 | 4.00–4.00 | 1 |",
		"| 8 processes: wake p50 / floor's p50 | 2.00× | 2.00–2.00× | 1 |",
		"| 1 waiter: handoff p50 / floor's p50, interleaved | 1.70× | 1.70–1.70× | 1 |",
		"| etcd: crash failover / TTL | 1.12× | 1.12–1.12× | 1 |",
		"| PostgreSQL lease: resign failover / mutex handoff | 1.29× | 1.29–1.29× | 1 |",
		"| PostgreSQL lease: Observe latency p50 (ms) | 37.71 | 37.71–37.71 | 1 |",
		"| etcd: Observe latency max (ms) | 25.09 | 25.09–25.09 | 1 |",
		"| PostgreSQL lease, 8 processes: permit's client calls per acquisition | 5.00 | 5.00–5.00 | 1 |",
		"| PostgreSQL lease, 8 processes: permit wake p50 / mutex's wake p50 | 1.50× | 1.50–1.50× | 1 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ns") && strings.Contains(out, "220000") {
		t.Errorf("an absolute time was printed:\n%s", out)
	}
	if len(missing) == 0 || !strings.Contains(strings.Join(missing, ";"), "etcd") {
		t.Errorf("missing = %v, want the rows without results", missing)
	}
}
