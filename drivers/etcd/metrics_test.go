package etcd

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// serverCounts reads the gRPC server counters of the etcd servers in this
// process (etcd registers them with the default Prometheus registry, so
// they sum over every embedded member): "handled:Method" counts finished
// unary calls and streams, "msg:Method" messages received on streams, and
// "started:Method" calls and streams begun.
func serverCounts(t testing.TB) map[string]float64 {
	t.Helper()
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]string{
		"grpc_server_handled_total":      "handled:",
		"grpc_server_msg_received_total": "msg:",
		"grpc_server_started_total":      "started:",
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		pfx, ok := names[mf.GetName()]
		if !ok {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "grpc_method" {
					out[pfx+lp.GetValue()] += m.GetCounter().GetValue()
				}
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
