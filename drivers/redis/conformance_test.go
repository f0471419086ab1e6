package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

func urlOf(addrs ...string) string { return "redis://" + strings.Join(addrs, ",") }

// openHarness returns a Harness that opens a fresh Locker on dsn per call.
func openHarness(dsn string, minTTL time.Duration) conformance.Harness {
	return conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			l, err := Open(ctx, dsn)
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
	l, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatalf("Open(%s): %v", dsn, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// drv is this driver as drivertest runs it.
var drv = drivertest.Driver{Open: func(dsn string) (driver.Locker, error) { return rediscore.Opened(Open(context.Background(), dsn)) }, URL: urlOf}

// TestConformanceSingle runs the suite, fault subtests included, on one
// server (drivertest.Driver.ConformanceSingle).
func TestConformanceSingle(t *testing.T) { drv.ConformanceSingle(t) }

// A Locker on an adopted client (New) passes the same suite.
func TestConformanceAdopted(t *testing.T) {
	drivertest.ConformanceAdopted(t, func(addr string) (driver.Locker, error) {
		cl := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
		l, err := New(context.Background(), cl, &Options{})
		if err != nil {
			cl.Close()
			return nil, err
		}
		return drivertest.CloseToo(l.core, func() { cl.Close() }), nil
	})
}

// TestConformanceRedlock runs the suite, fault subtests included, on five
// masters (drivertest.Driver.ConformanceRedlock). node_timeout 300ms:
// generous for a loaded machine under -race.
func TestConformanceRedlock(t *testing.T) { drv.ConformanceRedlock(t, "node_timeout=300ms") }

// TestConformanceCluster runs the suite, fault subtests included, on a
// Cluster of three masters (drivertest.Driver.ConformanceCluster).
func TestConformanceCluster(t *testing.T) { drv.ConformanceCluster(t) }

// TestConformanceSentinel runs the suite, fault subtests included, on a
// master, a replica and a sentinel (drivertest.Driver.ConformanceSentinel).
func TestConformanceSentinel(t *testing.T) { drv.ConformanceSentinel(t) }

// rediss:// against a TLS-only server (self-signed certificate, so the
// check is skipped with insecure_skip_verify=true).
func TestConformanceTLS(t *testing.T) {
	s := redistest.StartTLS(t)
	conformance.Run(t, openHarness("rediss://"+s.Addr+"?insecure_skip_verify=true", 0))
}

// TestCommandsPerOperation counts, with the servers' MONITOR, the commands
// each operation sends (drivertest.Commands): one per operation on a single
// server; on a Redlock over 3 masters, 3 per refresh and release and 6 per
// acquire (a vote on every node, then the token written back); a batch
// refresh of 3 locks, one per lock and node, in one pipeline per node.
func TestCommandsPerOperation(t *testing.T) {
	drivertest.CommandsPerOperation(t, func(addrs ...string) (driver.Locker, error) { return Open(context.Background(), urlOf(addrs...)) })
}

// A batch refresh falls back to EVAL when the server lost its scripts
// (drivertest.BatchAfterScriptFlush).
func TestBatchAfterScriptFlush(t *testing.T) {
	drivertest.BatchAfterScriptFlush(t, func(addr string) (driver.Locker, error) { return Open(context.Background(), urlOf(addr)) })
}
