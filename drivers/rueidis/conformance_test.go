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

// TestConformanceSingle runs the suite, fault subtests included (see
// drivertest.FaultHarness), on one server.
func TestConformanceSingle(t *testing.T) {
	addr, s := drivertest.FaultServer(t)
	conformance.Run(t, drivertest.FaultHarness(t, addr, s, func(addr string) (driver.Locker, error) {
		l, err := Open(urlOf(addr))
		if err != nil {
			return nil, err
		}
		return l, nil
	}))
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

func TestConformanceRedlock(t *testing.T) {
	ms := redistest.StartN(t, 5)
	addrs := redistest.Addrs(ms)
	// A node_timeout above the default 100ms: under -race on a loaded
	// 2-core host a node can miss 100ms, and a missed quorum costs a
	// retry and a clean-up on every node.
	dsn := urlOf(addrs...) + "?node_timeout=250ms"
	l := openT(t, dsn)
	conformance.Run(t, openHarness(dsn, l.Capabilities().MinTTL))
}

func TestConformanceCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	conformance.Run(t, openHarness(urlOf(c.Addrs()...)+"?cluster=true", 0))
}

func TestConformanceSentinel(t *testing.T) {
	sn := redistest.StartSentinel(t)
	conformance.Run(t, openHarness(urlOf(sn.Sentinel.Addr)+"?sentinel_master="+sn.Name, 0))
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
	s := redistest.Start(t)
	t.Run("single", func(t *testing.T) {
		drivertest.Commands(t, []string{s.Addr}, func() (driver.Locker, error) { return Open(urlOf(s.Addr)) })
	})
	ms := redistest.StartN(t, 3)
	t.Run("redlock", func(t *testing.T) {
		addrs := redistest.Addrs(ms)
		drivertest.Commands(t, addrs, func() (driver.Locker, error) { return Open(urlOf(addrs...)) })
	})
}
