package rediscore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// A Redlock grant is valid only if ttl − elapsed − (ttl×drift_factor + 2ms)
// > 0. Every node is reached through a proxy adding 300ms each way, so an
// acquire (gate node, the others, token write-back: three round trips)
// takes at least 1.8s. With a 3s TTL (the MinTTL of a 1s node timeout)
// that leaves a positive validity under drift_factor 0.01 and a negative
// one under 0.49 (1.472s of drift): the second attempt must be refused, as
// held, and leave no key behind, although a quorum of nodes granted it.
// The node timeout leaves 400ms beside each 600ms round trip, so that the
// clean-up of the refused grant is not itself cut short on a loaded
// machine.
func TestRedlockValidity(t *testing.T) {
	const n = 3
	ss := redistest.StartN(t, n)
	proxies := make([]*faultproxy.Proxy, n)
	conns := make([]Conn, n)
	for i, s := range ss {
		p, err := faultproxy.New(s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies[i] = p
		conns[i] = newTestConn(t, p.Addr())
	}
	const nodeTimeout, ttl, latency = time.Second, 3 * time.Second, 300 * time.Millisecond
	small := NewRedlock(conns, Options{NodeTimeout: nodeTimeout, DriftFactor: 0.01})
	large := NewRedlock(conns, Options{NodeTimeout: nodeTimeout, DriftFactor: 0.49})
	ctx := context.Background()

	// Open the connections (and load the scripts) before adding latency.
	if _, err := small.Acquire(ctx, "warm", "w", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := small.Release(ctx, "warm", "w"); err != nil {
		t.Fatal(err)
	}
	for _, p := range proxies {
		p.SetLatency(latency)
	}

	start := time.Now()
	if _, err := small.Acquire(ctx, "a", "x", ttl); err != nil {
		t.Fatalf("drift_factor 0.01, %v TTL, after %v: %v", ttl, time.Since(start), err)
	}
	if el := time.Since(start); el < 6*latency {
		t.Fatalf("acquire through the proxies took %v, want at least %v for the test to mean anything", el, 6*latency)
	}

	start = time.Now()
	_, err := large.Acquire(ctx, "b", "y", ttl)
	el := time.Since(start)
	var held *driver.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("drift_factor 0.49, %v TTL, after %v: err = %v, want a HeldError (validity ≤ 0)", ttl, el, err)
	}
	t.Logf("refused after %v: validity %v", el, ttl-el-(time.Duration(float64(ttl)*0.49)+redlockDriftFixed))
	for _, s := range ss {
		if v, err := s.Do("EXISTS", "locker:{b}"); err != nil || v != int64(0) {
			t.Fatalf("%s: EXISTS locker:{b} = %v, %v after a refused grant; want 0", s.Addr, v, err)
		}
	}
}
