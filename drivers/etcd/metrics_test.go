package etcd

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/etcdtest"

	"github.com/go-locker/locker"
	"github.com/go-locker/locker/driver"
)

// serverCounts reads the gRPC server counters of the etcd the tests share
// (testURL), as its members serve them at /metrics, summed over the
// members: "Method" counts unary calls handled and messages received on
// streams, "open:Method" streams opened.
func serverCounts(t testing.TB) map[string]float64 {
	t.Helper()
	eps := strings.Split(strings.TrimPrefix(testURL(t), "etcd://"), ",")
	mfs, err := etcdtest.Metrics(context.Background(), eps...)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var method, typ string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "grpc_method":
					method = lp.GetValue()
				case "grpc_type":
					typ = lp.GetValue()
				}
			}
			v := m.GetCounter().GetValue()
			switch name := mf.GetName(); {
			case typ == "unary" && name == "grpc_server_handled_total":
				out[method] += v
			case typ != "unary" && name == "grpc_server_msg_received_total":
				out[method] += v
			case typ != "unary" && name == "grpc_server_started_total":
				out["open:"+method] += v
			}
		}
	}
	return out
}

// countsSince returns the counters that changed since before.
func countsSince(t testing.TB, before map[string]float64) map[string]float64 {
	t.Helper()
	d := map[string]float64{}
	for k, v := range serverCounts(t) {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// expectCounts runs op and checks that the server counters it changed are
// exactly want.
func expectCounts(t *testing.T, what string, want map[string]float64, op func()) {
	t.Helper()
	countsOf(t, what, want, op, false)
}

// expectCountsOnStream is expectCounts for an operation that sends a
// keepalive on the stream its lease maps to (one of kaStreams): that stream
// may be opened by it, so an "open:LeaseKeepAlive" of 0 or 1 is accepted.
func expectCountsOnStream(t *testing.T, what string, want map[string]float64, op func()) {
	t.Helper()
	countsOf(t, what, want, op, true)
}

func countsOf(t *testing.T, what string, want map[string]float64, op func(), mayOpen bool) {
	t.Helper()
	before := serverCounts(t)
	op()
	// A counter is bumped as the server handles the request, before its
	// reply reaches the client; wait for the stragglers of a stream.
	deadline := time.Now().Add(5 * time.Second)
	var got map[string]float64
	for {
		got = countsSince(t, before)
		if mayOpen && got["open:LeaseKeepAlive"] == 1 {
			delete(got, "open:LeaseKeepAlive")
		}
		if reflect.DeepEqual(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s: the server handled %v, want %v", what, got, want)
	}
}

// Requests per operation, counted by the server (etcd's gRPC counters):
// the first Acquire grants a lease and runs one txn; Release is one txn;
// Refresh is one read-only txn (the owner check, batched with other
// locks' checks under load) and one keepalive message (the first one opens
// a keepalive stream of the Locker's); a later Acquire reuses the released
// lease: one txn and one keepalive message, on the stream its lease maps
// to, which that message may open; so does a waiting Acquire (AcquireWait)
// of a free key nobody queues for. Package locker adds one watch
// request per grant (the hold watch, on one stream) and one to cancel it at
// Release.
func TestRequestsPerOperation(t *testing.T) {
	ctx := testCtx(t)
	d := openTest(t, "")
	ttl := 10 * time.Second
	expectCounts(t, "first Acquire", map[string]float64{"LeaseGrant": 1, "Txn": 1}, func() {
		if _, err := d.Acquire(ctx, "k", "o", ttl); err != nil {
			t.Fatal(err)
		}
	})
	expectCounts(t, "first Refresh", map[string]float64{"Txn": 1, "open:LeaseKeepAlive": 1, "LeaseKeepAlive": 1}, func() {
		if err := d.Refresh(ctx, "k", "o", ttl); err != nil {
			t.Fatal(err)
		}
	})
	expectCounts(t, "Refresh", map[string]float64{"Txn": 1, "LeaseKeepAlive": 1}, func() {
		if err := d.Refresh(ctx, "k", "o", ttl); err != nil {
			t.Fatal(err)
		}
	})
	expectCounts(t, "Release", map[string]float64{"Txn": 1}, func() {
		if err := d.Release(ctx, "k", "o"); err != nil {
			t.Fatal(err)
		}
	})
	for i := range 3 {
		expectCountsOnStream(t, fmt.Sprintf("Acquire %d on a spare lease", i), map[string]float64{"Txn": 1, "LeaseKeepAlive": 1}, func() {
			if _, err := d.Acquire(ctx, "k", "o", ttl); err != nil {
				t.Fatal(err)
			}
		})
		expectCounts(t, "Release", map[string]float64{"Txn": 1}, func() {
			if err := d.Release(ctx, "k", "o"); err != nil {
				t.Fatal(err)
			}
		})
	}
	// A waiting Acquire (AcquireWait) of a free key nobody queues for
	// costs what Acquire does: the queue's check is a compare in the txn.
	for i := range 2 {
		expectCountsOnStream(t, fmt.Sprintf("AcquireWait %d, free, nobody queued", i), map[string]float64{"Txn": 1, "LeaseKeepAlive": 1}, func() {
			if _, err := d.AcquireWait(ctx, "k", "o", ttl); err != nil {
				t.Fatal(err)
			}
		})
		expectCounts(t, "Release", map[string]float64{"Txn": 1}, func() {
			if err := d.Release(ctx, "k", "o"); err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := d.Acquire(ctx, "k", "o", ttl); err != nil {
		t.Fatal(err)
	}
	// Without a spare lease, a refused Acquire grants one (kept as a
	// spare for the next attempt).
	for _, c := range []struct {
		what string
		want map[string]float64
	}{
		{"refused Acquire, no spare lease", map[string]float64{"LeaseGrant": 1, "Txn": 1}},
		{"refused Acquire on a spare lease", map[string]float64{"Txn": 1, "LeaseKeepAlive": 1}},
	} {
		expectCountsOnStream(t, c.what, c.want, func() {
			if _, err := d.Acquire(ctx, "k", "other", ttl); !errors.Is(err, driver.ErrNotAcquired) {
				t.Fatalf("Acquire of a held key: %v", err)
			}
		})
	}

	// Through package locker: the hold watch adds one watch request per
	// grant (the first opens the Locker's watch stream) and one to cancel
	// it at Release; renewal is Refresh, as above.
	l := locker.New(openTest(t, ""))
	defer l.Close()
	var lk *locker.Lock
	expectCounts(t, "locker TryAcquire", map[string]float64{"LeaseGrant": 1, "Txn": 1, "open:Watch": 1, "Watch": 1}, func() {
		var err error
		if lk, err = l.TryAcquire(ctx, "k", locker.WithTTL(ttl)); err != nil {
			t.Fatal(err)
		}
	})
	expectCounts(t, "locker Release", map[string]float64{"Txn": 1, "Watch": 1}, func() {
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})

}
