package drivertest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/redistest"
)

// monitor records the commands clients send to one server, through
// MONITOR, leaving out the commands scripts run ("[0 lua]"), the
// background traffic of the clients (PING, CLIENT, HELLO) and a Sentinel's
// probes of its master (INFO, PUBLISH on __sentinel__:hello).
type monitor struct {
	conn net.Conn
	mu   sync.Mutex
	cmds []string
	mark string // a command sent by the test to fence off what came before
	seen chan struct{}
}

func startMonitor(t testing.TB, addr string) *monitor {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	m := &monitor{conn: c, seen: make(chan struct{}, 16)}
	go func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if strings.Contains(line, " lua] ") {
				continue
			}
			_, cmd, ok := strings.Cut(line, "] \"")
			if !ok {
				continue
			}
			name, _, _ := strings.Cut(cmd, "\"")
			name = strings.ToLower(name)
			m.mu.Lock()
			switch {
			case strings.Contains(line, m.mark) && m.mark != "":
				m.seen <- struct{}{}
			case name == "ping" || name == "client" || name == "hello" || name == "echo":
			case name == "info" || strings.Contains(line, "__sentinel__"): // a Sentinel's probes of its master
			default:
				m.cmds = append(m.cmds, name)
			}
			m.mu.Unlock()
		}
	}()
	return m
}

// take returns the commands recorded since the last take: it sends a
// marker command to the server and waits until MONITOR has shown it, so
// every command sent before is in.
func (m *monitor) take(t testing.TB, addr string, n int) []string {
	t.Helper()
	m.mu.Lock()
	m.mark = fmt.Sprintf("drivertest-mark-%d", n)
	m.mu.Unlock()
	if _, err := redistest.Do(addr, "ECHO", m.mark); err != nil {
		t.Fatal(err)
	}
	select {
	case <-m.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("MONITOR did not show the marker within 10s")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	got := m.cmds
	m.cmds = nil
	return got
}

// Monitor records the commands clients send to one server, as Commands
// counts them (MONITOR, script internals and the clients' background
// traffic left out).
type Monitor struct {
	m    *monitor
	addr string
	n    int
}

// StartMonitor starts recording the commands sent to the server at addr;
// it stops with the test.
func StartMonitor(t testing.TB, addr string) *Monitor {
	return &Monitor{m: startMonitor(t, addr), addr: addr}
}

// Take returns the commands recorded since the last Take (lower-cased
// names), every command sent before the call included.
func (m *Monitor) Take(t testing.TB) []string {
	t.Helper()
	m.n++
	return m.m.take(t, m.addr, -m.n)
}

// CommandsPerOperation runs Commands on a single server and on a Redlock
// over 3 masters; open opens the driver's Locker on a URL of the given
// addresses.
func CommandsPerOperation(t *testing.T, open func(addrs ...string) (driver.Locker, error)) {
	s := redistest.Start(t)
	t.Run("single", func(t *testing.T) {
		Commands(t, []string{s.Addr}, func() (driver.Locker, error) { return open(s.Addr) })
	})
	ms := redistest.StartN(t, 3)
	t.Run("redlock", func(t *testing.T) {
		addrs := redistest.Addrs(ms)
		Commands(t, addrs, func() (driver.Locker, error) { return open(addrs...) })
	})
}

// Commands asserts how many commands (round trips: the driver sends one
// command per round trip and node) each operation of a raw driver.Locker
// sends to each server, counted by the servers themselves (MONITOR, script
// internals left out): acquire, refresh and release, and a waiting acquire
// of a free key, are one EVALSHA each on a single server; on a Redlock over len(addrs) masters, release and
// refresh are one EVALSHA per node, and acquire (and a waiting acquire,
// driver.BlockingAcquirer, of a free key) is the gate node's
// EVALSHA, then one on every other node, then the token write-back
// (one EVALSHA per granting node), so 2×N commands in three rounds. A
// driver.BatchRefresher's batch of 3 items is 3 EVALSHA per node, sent in
// one pipeline. open opens a driver on the servers.
func Commands(t *testing.T, addrs []string, open func() (driver.Locker, error)) {
	d, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Warm up: scripts loaded (a script's first use is EVALSHA, NOSCRIPT,
	// then EVAL), connections open.
	if _, err := d.Acquire(ctx, "warm", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := d.Refresh(ctx, "warm", "o", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ctx, "warm", "o"); err != nil {
		t.Fatal(err)
	}
	bw, blocking := d.(driver.BlockingAcquirer)
	if blocking {
		if _, err := bw.AcquireWait(ctx, "warm", "o", time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := d.Release(ctx, "warm", "o"); err != nil {
			t.Fatal(err)
		}
	}
	ms := make([]*monitor, len(addrs))
	for i, a := range addrs {
		ms[i] = startMonitor(t, a)
	}
	n := 0
	count := func(what string, want func(node int) int, op func() error) {
		t.Helper()
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		n++
		total, wantTotal := 0, 0
		for i, m := range ms {
			got := m.take(t, addrs[i], n)
			for _, c := range got {
				if c != "evalsha" {
					t.Errorf("%s: node %d got %q, want only EVALSHA (all: %v)", what, i, c, got)
				}
			}
			total += len(got)
			wantTotal += want(i)
		}
		if total != wantTotal {
			t.Errorf("%s: %d commands on %d servers, want %d", what, total, len(addrs), wantTotal)
		}
		t.Logf("%s: %d commands on %d servers", what, total, len(addrs))
	}
	nodes := len(addrs)
	one := func(int) int { return 1 }
	acquire := one
	if nodes > 1 {
		acquire = func(int) int { return 2 } // a vote, and the token written back
	}
	count("acquire", acquire, func() error { _, err := d.Acquire(ctx, "k", "o", time.Minute); return err })
	count("refresh", one, func() error { return d.Refresh(ctx, "k", "o", time.Minute) })
	if br, ok := d.(driver.BatchRefresher); ok {
		count("refresh-batch of 3", func(int) int { return 3 }, func() error { return batchOfThree(ctx, br) })
	}
	count("release", one, func() error { return d.Release(ctx, "k", "o") })
	if blocking {
		// A waiting acquire of a free key: the fair queue's fast path is
		// one script too, with no queue work.
		count("acquire-wait", acquire, func() error { _, err := bw.AcquireWait(ctx, "k", "o", time.Minute); return err })
		count("release", one, func() error { return d.Release(ctx, "k", "o") })
	}
}

// batchOfThree refreshes, in one batch, the held lock "k" of owner "o" and
// two keys nobody holds: "k" must be refreshed, the others not held.
func batchOfThree(ctx context.Context, br driver.BatchRefresher) error {
	errs := br.RefreshBatch(ctx, []driver.RefreshItem{
		{Key: "k", Owner: "o", TTL: time.Minute}, {Key: "free-1", Owner: "o", TTL: time.Minute}, {Key: "free-2", Owner: "o", TTL: time.Minute},
	})
	if len(errs) != 3 {
		return fmt.Errorf("%d results for 3 items", len(errs))
	}
	if errs[0] != nil {
		return errs[0]
	}
	for _, err := range errs[1:] {
		if !errors.Is(err, driver.ErrNotHeld) {
			return fmt.Errorf("a free key's item: %v, want ErrNotHeld", err)
		}
	}
	return nil
}

// BatchAfterScriptFlush checks a driver.BatchRefresher's fallback to EVAL:
// after SCRIPT FLUSH, a batch (every item NOSCRIPT at first) still
// refreshes the held lock to the batch's TTL and reports the free key not
// held. open opens the driver on a server's address.
func BatchAfterScriptFlush(t *testing.T, open func(addr string) (driver.Locker, error)) {
	s := redistest.Start(t)
	d, err := open(s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := d.Acquire(ctx, "k", "o", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := redistest.Do(s.Addr, "SCRIPT", "FLUSH"); err != nil {
		t.Fatal(err)
	}
	br := d.(driver.BatchRefresher)
	if err := batchOfThree(ctx, br); err != nil {
		t.Fatalf("batch after SCRIPT FLUSH: %v", err)
	}
	info, err := d.(driver.Inspector).Inspect(ctx, "k")
	if err != nil || info.Remaining <= 50*time.Second {
		t.Fatalf("after the batch: %+v, %v; want about a minute left", info, err)
	}
}
