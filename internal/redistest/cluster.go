package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters (no replicas) on loopback.
type Cluster struct {
	// Masters are the cluster's nodes; master i serves an equal share of
	// the 16384 slots.
	Masters []*Server
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Masters))
	for i, s := range c.Masters {
		out[i] = s.Addr
	}
	return out
}

// StartCluster starts n masters with cluster-enabled, assigns every slot
// (CLUSTER ADDSLOTSRANGE), joins them (CLUSTER MEET) and waits until every
// node reports cluster_state:ok and knows all slots. args are added to
// every node's command line (for example "--appendonly", "yes"). It calls
// t.Fatal on failure.
func StartCluster(t testing.TB, n int, args ...string) *Cluster {
	t.Helper()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		c.Masters = append(c.Masters, Start(t, append([]string{"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"}, args...)...))
	}
	const slots = 16384
	for i, s := range c.Masters {
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if _, err := s.Do("CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)); err != nil {
			t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on %s: %v", s.Addr, err)
		}
	}
	for _, s := range c.Masters[1:] {
		if _, err := c.Masters[0].Do("CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(s.Port)); err != nil {
			t.Fatalf("redistest: CLUSTER MEET %s: %v", s.Addr, err)
		}
	}
	if err := c.WaitReady(60 * time.Second); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// WaitReady waits up to limit until every master reports cluster_state:ok,
// has an established bus link to every other node (none in handshake),
// knows every node and serves every slot range.
func (c *Cluster) WaitReady(limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, s := range c.Masters {
		for {
			err := clusterReady(s, len(c.Masters))
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster not ready after %v: %w", limit, err)
			}
			time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
		}
	}
	return nil
}

func clusterReady(s *Server, n int) error {
	v, err := s.Do("CLUSTER", "INFO")
	if err != nil {
		return err
	}
	info, _ := v.(string)
	if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") {
		return fmt.Errorf("%s: %s", s.Addr, info)
	}
	v, err = s.Do("CLUSTER", "SLOTS")
	if err != nil {
		return err
	}
	if a, _ := v.([]any); len(a) != n {
		return fmt.Errorf("%s: CLUSTER SLOTS has %d ranges, want %d", s.Addr, len(a), n)
	}
	// cluster_known_nodes counts nodes still in handshake, and a node
	// broadcasts (PUBLISH among others) only over its established bus
	// links: wait until every other node is connected and out of handshake.
	v, err = s.Do("CLUSTER", "NODES")
	if err != nil {
		return err
	}
	nodes, _ := v.(string)
	lines := strings.Split(strings.TrimSpace(nodes), "\n")
	if len(lines) != n {
		return fmt.Errorf("%s: CLUSTER NODES lists %d nodes, want %d", s.Addr, len(lines), n)
	}
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) < 8 {
			return fmt.Errorf("%s: CLUSTER NODES line %q", s.Addr, line)
		}
		flags, link := f[2], f[7]
		if strings.Contains(flags, "handshake") || strings.Contains(flags, "noaddr") || strings.Contains(flags, "fail") || link != "connected" {
			return fmt.Errorf("%s: node not ready: %q", s.Addr, line)
		}
	}
	return nil
}

// Sentinel is a master, one replica and one sentinel monitoring the master
// under the name in Name (quorum 1).
type Sentinel struct {
	// Name is the monitored master's name, "mymaster".
	Name string
	// Master is the master; Replica replicates it.
	Master, Replica *Server
	// Sentinel is the sentinel process.
	Sentinel *Server
}

// StartSentinel starts a master, a replica of it and a sentinel, and waits
// until the replica is in sync and the sentinel knows the master. It calls
// t.Fatal on failure.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	sn := &Sentinel{Name: "mymaster"}
	sn.Master = Start(t)
	sn.Replica = Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(sn.Master.Port))
	sn.Sentinel = startSentinel(t, sn.Name, sn.Master.Port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		v, _ := sn.Replica.Do("INFO", "replication")
		info, _ := v.(string)
		a, _ := sn.Sentinel.Do("SENTINEL", "get-master-addr-by-name", sn.Name)
		addr, _ := a.([]any)
		if strings.Contains(info, "master_link_status:up") && len(addr) == 2 {
			return sn
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel set-up not ready: replica %q sentinel %v", info, a)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline
	}
}

func startSentinel(t testing.TB, name string, masterPort int) *Server {
	t.Helper()
	bin := Binary(t)
	var last error
	for attempt := 0; attempt < 5; attempt++ {
		dir := t.TempDir()
		port, err := FreePort()
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
			port, dir, name, masterPort, name, name)
		path := dir + "/sentinel.conf"
		if err := writeFile(path, conf); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		s := &Server{t: t, Dir: dir, Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port)}
		s.args = []string{"--sentinel"}
		s.confFile = path
		if last = s.start(bin); last == nil {
			t.Cleanup(s.cleanup)
			return s
		}
	}
	t.Fatalf("redistest: cannot start sentinel: %v", last)
	return nil
}
