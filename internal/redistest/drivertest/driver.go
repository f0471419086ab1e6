package drivertest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// Driver is a Redis driver under test, for the conformance runs both
// drivers make in every mode.
type Driver struct {
	// Open opens a Locker from one of the driver's URLs.
	Open func(dsn string) (driver.Locker, error)
	// URL is the driver's URL for one server or several hosts, without
	// query parameters.
	URL func(addrs ...string) string
}

// ConformanceSingle runs the suite, fault subtests included (see
// FaultHarness), on one server.
func (d Driver) ConformanceSingle(t *testing.T) {
	addr, s := FaultServer(t)
	conformance.Run(t, FaultHarness(t, addr, s, func(addr string) (driver.Locker, error) { return d.Open(d.URL(addr)) }))
}

// ConformanceRedlock runs the suite, fault subtests included (see
// RedlockFaultHarness), on five masters; params are added to every URL.
func (d Driver) ConformanceRedlock(t *testing.T, params ...string) {
	addrs, ms := RedlockFaultServers(t, 5)
	open := func(addrs []string) (driver.Locker, error) { return d.Open(With(d.URL(addrs...), params...)) }
	probe, err := open(addrs)
	if err != nil {
		t.Fatal(err)
	}
	minTTL := probe.(driver.Capable).Capabilities().MinTTL
	probe.Close()
	conformance.Run(t, RedlockFaultHarness(t, addrs, ms, minTTL, open))
}

// ConformanceCluster runs the suite, fault subtests included (see
// ClusterFaultHarness), on a Cluster of three masters.
func (d Driver) ConformanceCluster(t *testing.T) {
	addrs, c := ClusterFaultServers(t, 3)
	conformance.Run(t, ClusterFaultHarness(t, addrs, c, func(addrs []string) (driver.Locker, error) {
		return d.Open(With(d.URL(addrs...), "cluster=true"))
	}))
}

// ConformanceSentinel runs the suite, fault subtests included (see
// SentinelFaultHarness), on a master, a replica and a sentinel.
func (d Driver) ConformanceSentinel(t *testing.T) {
	addr := SentinelFaultServers(t)
	conformance.Run(t, SentinelFaultHarness(addr, func(addr string) (driver.Locker, error) {
		return d.Open(With(d.URL(addr), "sentinel_master=mymaster"))
	}))
}

// ConformanceAdopted runs the suite on one server, on Lockers that adopt
// builds on clients of their own (New) for the server at addr.
func ConformanceAdopted(t *testing.T, adopt func(addr string) (driver.Locker, error)) {
	s := redistest.Start(t)
	conformance.Run(t, conformance.Harness{
		Open: func(context.Context) (driver.Locker, error) { return adopt(s.Addr) },
	})
}

// Adopted is a Locker on clients its owner adopted it from (New,
// NewRedlock): Close closes the Locker, then runs closeClients, as the
// owner would. It has the Locker's every method.
type Adopted struct {
	*rediscore.Locker
	closeClients func()
}

// CloseToo returns l whose Close also runs closeClients afterwards.
func CloseToo(l *rediscore.Locker, closeClients func()) *Adopted {
	return &Adopted{l, closeClients}
}

// Close closes the Locker, then the clients.
func (a *Adopted) Close() error {
	err := a.Locker.Close()
	a.closeClients()
	return err
}

// WaitFor polls cond until it holds, and fails t once d has passed.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
}

// NotRedis returns the address of a port that accepts TCP and answers
// HTTP: a server that does not speak Redis. It closes when t ends.
func NotRedis(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				_, _ = c.Read(buf)
				_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			}()
		}
	}()
	return ln.Addr().String()
}
