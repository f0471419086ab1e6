// Package etcdtest starts real etcd servers for tests: etcd v3
// (go.etcd.io/etcd/server/v3/embed) in processes of their own, built from
// ./etcdserver without the race detector, on free loopback ports, with their
// data in a temporary directory. A member is a real process: Kill sends it
// SIGKILL, Stop SIGTERM, and neither the test's race detector nor its
// garbage collector slows the server.
//
// Start gives a single member, StartCluster a cluster of n members. Members
// can be stopped and restarted (keeping their data and ports) to exercise
// failures. Everything is torn down by t.Cleanup. When a server cannot be
// started the test fails (t.Fatal); it never skips. The first Start of a
// process builds the server with the go command (found on PATH, as go test
// puts it there), once per process.
//
// New and Close do the same without a testing.TB, for a TestMain or a
// command. Typical use:
//
//	c := etcdtest.Start(t)
//	url := "etcd://" + strings.Join(c.Endpoints(), ",") + "/myprefix"
//
// Timing: members use etcd's default heartbeat (100ms) and election timeout
// (1s), so the server's minimum lease TTL is 1.5s and a lost leader is
// replaced within a few seconds.
package etcdtest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// StartTimeout bounds how long a member may take to start and serve.
const StartTimeout = 60 * time.Second

// Cluster is a set of etcd members started by Start or StartCluster.
type Cluster struct {
	// Members are the cluster's members, in the order they were created.
	Members []*Member

	root string // temporary directory holding the members' data
}

// Member is one etcd server, a process of its own.
type Member struct {
	// Name is the member's name ("m0", "m1", …).
	Name string

	dir     string
	client  url.URL
	peer    url.URL
	initial string // initial-cluster string

	mu sync.Mutex
	p  *proc // nil while stopped
}

// Start starts a single-member etcd and returns it. It fails the test if the
// server cannot be started. The server is stopped by t.Cleanup.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return StartCluster(t, 1)
}

// StartCluster starts an n-member etcd cluster on loopback and waits until it
// has a leader. It fails the test if the cluster cannot be started. All
// members are stopped, and their data removed, by t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c, err := New(n)
	if err != nil {
		t.Fatalf("etcdtest: cannot start etcd: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// New starts an n-member cluster like StartCluster, for use outside a test
// (a TestMain, a benchmark harness, a command). The caller must call Close.
func New(n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("cluster size %d < 1", n)
	}
	var lastErr error
	// A free port picked here can be taken by another process before etcd
	// binds it; try a few times with fresh ports.
	for attempt := 0; attempt < 3; attempt++ {
		c, err := tryStart(n)
		if err == nil {
			if _, err := c.WaitLeader(StartTimeout); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStart(n int) (*Cluster, error) {
	root, err := os.MkdirTemp("", "etcdtest-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{root: root}
	var initial []string
	for i := 0; i < n; i++ {
		cp, err := freePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		pp, err := freePort()
		if err != nil {
			c.Close()
			return nil, err
		}
		m := &Member{
			Name:   fmt.Sprintf("m%d", i),
			dir:    filepath.Join(root, fmt.Sprintf("m%d", i)),
			client: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", cp)},
			peer:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)},
		}
		initial = append(initial, m.Name+"="+m.peer.String())
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
	}
	// Members of a multi-member cluster wait for each other, so start them
	// concurrently.
	errs := make(chan error, n)
	for _, m := range c.Members {
		go func() { errs <- m.start(true) }()
	}
	var first error
	for range c.Members {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		c.Close()
		return nil, first
	}
	return c, nil
}

// freePort returns a port of 127.0.0.1 that is free now, below the kernel's
// ephemeral range (32768 and up by default): a port there can be taken by
// any outgoing connection or port-0 listener while its member is stopped,
// and its Restart would then fail to bind it.
func freePort() (int, error) {
	for range 100 {
		port := lowPortMin + rand.IntN(lowPortMax-lowPortMin)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		ln.Close()
		return port, nil
	}
	return 0, errors.New("etcdtest: no free port below the ephemeral range in 100 tries")
}

// The range freePort picks from.
const (
	lowPortMin = 20000
	lowPortMax = 32000
)

func (m *Member) start(fresh bool) error {
	if err := os.MkdirAll(m.dir, 0o700); err != nil {
		return err
	}
	p, err := startProc(m.dir+".log", "-name", m.Name, "-dir", m.dir,
		"-client", m.client.String(), "-peer", m.peer.String(),
		"-initial", m.initial, "-new="+strconv.FormatBool(fresh))
	if err != nil {
		return fmt.Errorf("member %s: %w", m.Name, err)
	}
	m.mu.Lock()
	m.p = p
	m.mu.Unlock()
	return nil
}

// Endpoint returns the member's client address, "127.0.0.1:port".
func (m *Member) Endpoint() string { return m.client.Host }

// Running reports whether the member is started.
func (m *Member) Running() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p != nil
}

func (m *Member) take() *proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.p
	m.p = nil
	return p
}

// Stop shuts the member down gracefully with SIGTERM (a leader first hands
// leadership to a peer), and waits until the process has exited. Its data
// and ports are kept for Restart. Stopping a stopped member does nothing.
// See Kill for a crash.
func (m *Member) Stop() {
	if p := m.take(); p != nil {
		p.stop()
	}
}

// Kill stops the member abruptly with SIGKILL, as a crash would, and waits
// until the process has exited. Its data and ports are kept for Restart.
// Killing a stopped member does nothing.
func (m *Member) Kill() {
	if p := m.take(); p != nil {
		p.kill()
	}
}

// Restart starts a stopped member again on the same ports with its data,
// and returns once it serves clients. It is an error to restart a running
// member.
func (m *Member) Restart() error {
	if m.Running() {
		return fmt.Errorf("etcdtest: member %s is running", m.Name)
	}
	if err := m.start(false); err != nil {
		return fmt.Errorf("etcdtest: restart: %w", err)
	}
	return nil
}

// status returns the member's view of the raft leader and its own id; ok
// is false when the member is stopped or does not answer.
func (m *Member) status() (leader, self uint64, ok bool) {
	m.mu.Lock()
	p := m.p
	m.mu.Unlock()
	if p == nil {
		return 0, 0, false
	}
	return p.status()
}

// IsLeader reports whether the member is running and is the raft leader.
func (m *Member) IsLeader() bool {
	l, self, ok := m.status()
	return ok && l != 0 && l == self
}

// Close kills every member and removes their data. It is idempotent.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Add(1)
		go func() { defer wg.Done(); m.Kill() }()
	}
	wg.Wait()
	if c.root != "" {
		_ = os.RemoveAll(c.root)
	}
}

// Endpoints returns the client addresses of all members ("127.0.0.1:port").
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.Endpoint()
	}
	return eps
}

// URL returns an etcd:// URL for all members with the given path (key
// prefix), for example "etcd://127.0.0.1:1234,127.0.0.1:1235/prefix".
func (c *Cluster) URL(path string) string {
	return "etcd://" + strings.Join(c.Endpoints(), ",") + path
}

// Leader returns the current leader among the running members, or nil if
// none of them is leader right now.
func (c *Cluster) Leader() *Member {
	for _, m := range c.Members {
		if m.IsLeader() {
			return m
		}
	}
	return nil
}

// WaitLeader waits up to timeout until a running member is leader and every
// running member agrees on it, and returns it.
func (c *Cluster) WaitLeader(timeout time.Duration) (*Member, error) {
	deadline := time.Now().Add(timeout)
	for {
		if m := c.agreedLeader(); m != nil {
			return m, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no leader after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition with a deadline
	}
}

func (c *Cluster) agreedLeader() *Member {
	var lead uint64
	var leader *Member
	for _, m := range c.Members {
		if !m.Running() {
			continue
		}
		l, self, ok := m.status()
		if !ok || l == 0 || (lead != 0 && l != lead) {
			return nil
		}
		lead = l
		if self == l {
			leader = m
		}
	}
	return leader
}

// Client returns a clientv3 client for the given members (all members if
// none are given), closed by t.Cleanup.
func (c *Cluster) Client(t testing.TB, members ...*Member) *clientv3.Client {
	t.Helper()
	if len(members) == 0 {
		members = c.Members
	}
	eps := make([]string, len(members))
	for i, m := range members {
		eps[i] = m.Endpoint()
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   eps,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		t.Fatalf("etcdtest: client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}
