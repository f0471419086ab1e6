package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
	"github.com/go-locker/locker/conformance/faultproxy"
	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/etcdtest"
)

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// faultsURLEnv carries the URL (server and key prefix) to the child process
// of the suite's Faults/Pause.
const faultsURLEnv = "LOCKER_ETCD_FAULTS_URL"

// TestConformance runs the shared suite against a real etcd server, with
// the faults it can stage: each Locker reaches the server through its own
// fault proxy (Cut blackholes it, Reset resets its connections); Restart
// stops the member and starts it again with its data; Pause holds a lock
// from a child process. etcd never loses committed data, so there is no
// RestartEmpty. With LOCKER_TEST_ETCD_URL set, the suite runs on that server
// without Restart.
func TestConformance(t *testing.T) {
	var c *etcdtest.Cluster
	raw := os.Getenv(faultsURLEnv)
	if raw == "" {
		if os.Getenv("LOCKER_TEST_ETCD_URL") != "" {
			raw = testURL(t) + uniquePrefix(t)
		} else {
			c = etcdtest.Start(t)
			raw = c.URL(uniquePrefix(t))
		}
	}
	var restart func(context.Context) error
	if c != nil {
		restart = func(context.Context) error {
			m := c.Members[0]
			m.Stop()
			return m.Restart()
		}
	}
	conformance.Run(t, faultHarness(t, raw, restart))
}

// TestConformanceCluster runs the suite on a 3-member cluster; its Restart
// stops the leader and starts it again, so the cluster elects another
// leader meanwhile.
func TestConformanceCluster(t *testing.T) {
	var c *etcdtest.Cluster
	raw := os.Getenv(faultsURLEnv)
	if raw == "" {
		c = etcdtest.StartCluster(t, 3)
		raw = c.URL(uniquePrefix(t))
	}
	var restart func(context.Context) error
	if c != nil {
		restart = func(context.Context) error {
			m, err := c.WaitLeader(30 * time.Second)
			if err != nil {
				return err
			}
			m.Stop()
			return m.Restart()
		}
	}
	conformance.Run(t, faultHarness(t, raw, restart))
}

// faultHarness returns the Harness for the etcd at raw (endpoints and key
// prefix): each Locker reaches every endpoint through a fault proxy of its
// own (Cut blackholes them, Reset resets their connections); Restart, when
// not nil, restarts a member with its data; Pause holds a lock from a child
// process, which reaches the same server through ChildEnv.
func faultHarness(t *testing.T, raw string, restart func(context.Context) error) conformance.Harness {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	proxies := map[driver.Locker][]*faultproxy.Proxy{}
	proxyOf := func(d driver.Locker) ([]*faultproxy.Proxy, error) {
		mu.Lock()
		defer mu.Unlock()
		if ps := proxies[d]; ps != nil {
			return ps, nil
		}
		return nil, fmt.Errorf("%T was not opened by this Harness", d)
	}
	return conformance.Harness{
		Open: func(ctx context.Context) (driver.Locker, error) {
			var ps []*faultproxy.Proxy
			var hosts []string
			for _, host := range strings.Split(u.Host, ",") {
				p, err := faultproxy.New(host)
				if err != nil {
					return nil, err
				}
				t.Cleanup(func() { _ = p.Close() })
				ps = append(ps, p)
				hosts = append(hosts, p.Addr())
			}
			pu := *u
			pu.Host = strings.Join(hosts, ",")
			d, err := Driver{}.Open(pu.String())
			if err != nil {
				return nil, err
			}
			mu.Lock()
			proxies[d] = ps
			mu.Unlock()
			return d, nil
		},
		MinTTL: DefaultMinTTL,
		Cut: func(d driver.Locker) (func(), error) {
			ps, err := proxyOf(d)
			if err != nil {
				return nil, err
			}
			for _, p := range ps {
				p.Blackhole()
			}
			return func() {
				for _, p := range ps {
					p.Heal()
				}
			}, nil
		},
		Reset: func(d driver.Locker) error {
			ps, err := proxyOf(d)
			if err != nil {
				return err
			}
			for _, p := range ps {
				p.Reset()
			}
			return nil
		},
		Pause:    true,
		ChildEnv: []string{faultsURLEnv + "=" + raw, "LOCKER_TEST_ETCD_URL=" + raw},
		Restart:  restart,
	}
}
