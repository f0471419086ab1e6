package rueidis

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
	"github.com/go-locker/locker/internal/redistest/drivertest"
)

// TestConformanceSingle runs the suite, fault subtests included (see
// drivertest.FaultHarness), on one server.
func TestConformanceSingle(t *testing.T) {
	addr, s := drivertest.FaultServer(t)
	conformance.Run(t, drivertest.FaultHarness(t, addr, s, func(addr string) (driver.Locker, error) { return Open(urlOf(addr)) }))
}

// A Locker on an adopted client (New) waits on pub/sub instead of
// client-side caching; it passes the same suite.
func TestConformanceAdopted(t *testing.T) {
	s := redistest.Start(t)
	conformance.Run(t, conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true})
			if err != nil {
				return nil, err
			}
			l, err := New(cl)
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
	cl rueidis.Client
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
	// A node_timeout above the default 100ms: under -race on a loaded
	// 2-core host a node can miss 100ms, and a missed quorum costs a
	// retry and a clean-up on every node.
	dsnOf := func(addrs []string) string { return urlOf(addrs...) + "?node_timeout=250ms" }
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

// NewRedlock over adopted clients (pub/sub waits on every master).
func TestConformanceAdoptedRedlock(t *testing.T) {
	ms := redistest.StartN(t, 3)
	o := Options{NodeTimeout: 250 * time.Millisecond}
	var minTTL time.Duration
	h := conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			var cls []rueidis.Client
			closeAll := func() {
				for _, c := range cls {
					c.Close()
				}
			}
			for _, m := range ms {
				cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr}, ForceSingleClient: true})
				if err != nil {
					closeAll()
					return nil, err
				}
				cls = append(cls, cl)
			}
			l, err := NewRedlock(cls, o)
			if err != nil {
				closeAll()
				return nil, err
			}
			return &closeClients{l, closeAll}, nil
		},
	}
	probe, err := h.Open(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	minTTL = probe.(*closeClients).Capabilities().MinTTL
	probe.Close()
	h.MinTTL = minTTL
	conformance.Run(t, h)
}

type closeClients struct {
	*Locker
	closeAll func()
}

func (c *closeClients) Close() error {
	err := c.Locker.Close()
	c.closeAll()
	return err
}

// TestCommandsPerOperation: as the go-redis driver's (drivertest.Commands).
func TestCommandsPerOperation(t *testing.T) {
	drivertest.CommandsPerOperation(t, func(addrs ...string) (driver.Locker, error) { return Open(urlOf(addrs...)) })
}
