package etcd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/conformance"
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
	h := faultHarness(t, raw, restart)
	h.MinTTL = embeddedUnit
	conformance.Run(t, h)
}

// embeddedUnit is the suite's unit on the test members (etcdtest): under
// -race, beside another package's tests on the second core in a full run,
// a renewal's round trip took up to 560ms, and a 2s TTL (renewals every
// 667ms, each given as long) left them too little room: Locker/AutoRenew,
// Contention and the election subtests lost their locks at the safe
// deadline. (The members then ran inside the test process; they now run
// as processes of their own, and the unit is kept.)
const embeddedUnit = 3 * time.Second

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
	h := faultHarness(t, raw, restart)
	h.MinTTL = embeddedUnit
	conformance.Run(t, h)
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
	px := conformance.NewProxied(strings.Split(u.Host, ","), func(_ context.Context, addrs []string) (driver.Locker, error) {
		pu := *u
		pu.Host = strings.Join(addrs, ",")
		return Driver{}.Open(pu.String())
	})
	t.Cleanup(func() { _ = px.Close() })
	return conformance.Harness{
		Open:     px.Open,
		MinTTL:   DefaultMinTTL,
		Cut:      px.Cut,
		Reset:    px.Reset,
		Pause:    true,
		ChildEnv: []string{faultsURLEnv + "=" + raw, "LOCKER_TEST_ETCD_URL=" + raw},
		Restart:  restart,
	}
}
