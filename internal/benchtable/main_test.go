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
