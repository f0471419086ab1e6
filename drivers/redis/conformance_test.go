package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

func urlOf(addrs ...string) string { return "redis://" + strings.Join(addrs, ",") }

// openHarness returns a Harness that opens a fresh Locker on dsn per call.
func openHarness(dsn string, minTTL time.Duration) conformance.Harness {
	return conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			l, err := Open(dsn)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
		MinTTL: minTTL,
	}
}

func openT(t testing.TB, dsn string) *Locker {
	t.Helper()
	l, err := Open(dsn)
	if err != nil {
		t.Fatalf("Open(%s): %v", dsn, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestConformanceSingle runs the suite, fault subtests included (see
// drivertest.FaultHarness), on one server.
func TestConformanceSingle(t *testing.T) {
	addr, s := drivertest.FaultServer(t)
	conformance.Run(t, drivertest.FaultHarness(t, addr, s, func(addr string) (driver.Locker, error) { return Open(urlOf(addr)) }))
}

// A Locker on an adopted client (New) passes the same suite.
func TestConformanceAdopted(t *testing.T) {
	s := redistest.Start(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
			l, err := New(cl, Options{})
			if err != nil {
				cl.Close()
				return nil, err
			}
			return &closeBoth{l, cl}, nil
		},
	})
}

// closeBoth closes the adopted client after the Locker, as its owner would.
type closeBoth struct {
	*Locker
	cl redis.UniversalClient
}

func (c *closeBoth) Close() error {
	err := c.Locker.Close()
	c.cl.Close()
	return err
}

// TestConformanceRedlock runs the suite, fault subtests included (see
// drivertest.RedlockFaultHarness), on five masters.
func TestConformanceRedlock(t *testing.T) {
	addrs, ms := drivertest.RedlockFaultServers(t, 5)
	// node_timeout 200ms: generous for a loaded machine under -race.
	dsnOf := func(addrs []string) string { return drivertest.With(urlOf(addrs...), "node_timeout=200ms") }
	l := openT(t, dsnOf(addrs))
	conformance.Run(t, drivertest.RedlockFaultHarness(t, addrs, ms, l.Capabilities().MinTTL, func(addrs []string) (driver.Locker, error) { return Open(dsnOf(addrs)) }))
}

// TestConformanceCluster runs the suite, fault subtests included (see
// drivertest.ClusterFaultHarness), on a Cluster of three masters.
func TestConformanceCluster(t *testing.T) {
	addrs, c := drivertest.ClusterFaultServers(t, 3)
	conformance.Run(t, drivertest.ClusterFaultHarness(t, addrs, c, func(addrs []string) (driver.Locker, error) { return Open(urlOf(addrs...) + "?cluster=true") }))
}

// TestConformanceSentinel runs the suite, fault subtests included (see
// drivertest.SentinelFaultHarness), on a master, a replica and a sentinel.
func TestConformanceSentinel(t *testing.T) {
	addr := drivertest.SentinelFaultServers(t)
	conformance.Run(t, drivertest.SentinelFaultHarness(addr, func(addr string) (driver.Locker, error) {
		l, err := Open(urlOf(addr) + "?sentinel_master=mymaster")
		if err != nil {
			return nil, err
		}
		return l, nil
	}))
}

// rediss:// against a TLS-only server (self-signed certificate, so the
// check is skipped with insecure_skip_verify=true).
func TestConformanceTLS(t *testing.T) {
	s := redistest.StartTLS(t)
	conformance.Run(t, openHarness("rediss://"+s.Addr+"?insecure_skip_verify=true", 0))
}

// TestCommandsPerOperation counts, with the servers' MONITOR, the commands
// each operation sends (drivertest.Commands): one per operation on a single
// server; on a Redlock over 3 masters, 3 per refresh and release and 6 per
// acquire (a vote on every node, then the token written back).
func TestCommandsPerOperation(t *testing.T) {
	drivertest.CommandsPerOperation(t, func(addrs ...string) (driver.Locker, error) { return Open(urlOf(addrs...)) })
}
