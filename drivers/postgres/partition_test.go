package postgres

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-locker/locker/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// A real network partition between the holder and the server: the
// holder's session, and so its lock, survives until the TTL has passed
// since its last statement, on a server configured to give up on silent
// clients early: keepalive after 1s idle, one probe, 1s apart, and
// tcp_user_timeout 1s (unacknowledged data, such as a reply in flight when
// the partition starts, ends the connection after 1s). The driver raises
// the session's tcp_user_timeout and tcp_keepalives_idle to the TTL for
// that; with those statements removed, the server ends the session within
// about 2s of the partition, before the 4s TTL, and this test fails. The
// holder runs in a network namespace the test creates, joined to the
// server by a veth pair; the partition is a blackhole route on each side.
// Needs root (ip netns, ip route).
func TestPartitionKeepsSessionForTTL(t *testing.T) {
	ns := fmt.Sprintf("lkpart%d", os.Getpid()%100000)
	hostIf, nsIf := "lkh"+ns[6:], "lkn"+ns[6:]
	const hostIP, nsIP = "10.213.77.1", "10.213.77.2"
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "del", ns).Run() // also removes the veth pair
		_ = exec.Command("ip", "link", "del", hostIf).Run()
	})
	// Traffic for the test's addresses never takes the default route, even
	// when the veth pair is gone.
	ip("route", "add", "unreachable", "10.213.77.0/24", "metric", "4000")
	t.Cleanup(func() {
		_ = exec.Command("ip", "route", "del", "unreachable", "10.213.77.0/24", "metric", "4000").Run()
	})
	ip("link", "add", hostIf, "type", "veth", "peer", "name", nsIf)
	ip("link", "set", nsIf, "netns", ns)
	ip("addr", "add", hostIP+"/30", "dev", hostIf)
	ip("link", "set", hostIf, "up")
	ip("netns", "exec", ns, "ip", "addr", "add", nsIP+"/30", "dev", nsIf)
	ip("netns", "exec", ns, "ip", "link", "set", nsIf, "up")
	ip("netns", "exec", ns, "ip", "link", "set", "lo", "up")

	srv := pgtest.Start(t, "listen_addresses=127.0.0.1,"+hostIP,
		"tcp_keepalives_idle=1", "tcp_keepalives_interval=1", "tcp_keepalives_count=1", "tcp_user_timeout=1000")
	ctx := ctxFor(t, 3*time.Minute)
	hba := filepath.Join(srv.DataDir(), "pg_hba.conf")
	f, err := os.OpenFile(hba, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "host all all %s/32 trust\n", nsIP)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	mon, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close(ctx)
	if _, err := mon.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		t.Fatal(err)
	}

	const ttl = 4 * time.Second
	key := fmt.Sprintf("partition/%d", time.Now().UnixNano())
	url := fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=disable", hostIP, srv.Port())
	var c *child
	deadline := time.Now().Add(30 * time.Second)
	for {
		// pg_hba.conf is reloaded asynchronously: the child's Open fails
		// until it is.
		c = startHolderChildIn(t, []string{"ip", "netns", "exec", ns}, url, key, "partitioned", ttl)
		line := c.next(t, 60*time.Second)
		if strings.HasPrefix(line, "ACQUIRED ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("holder in the namespace: %s", line)
		}
	}

	// Partition: a blackhole route on each side for the other's address, so
	// every packet between them is dropped where it is sent (and none
	// leaves the machine). Then read when the server's idle timer for the
	// holder started (Remaining is the TTL minus the session's idle time).
	heal := func() {
		_ = exec.Command("ip", "route", "del", "blackhole", nsIP+"/32").Run()
		_ = exec.Command("ip", "netns", "exec", ns, "ip", "route", "del", "blackhole", hostIP+"/32").Run()
	}
	t.Cleanup(heal)
	ip("route", "add", "blackhole", nsIP+"/32")
	ip("netns", "exec", ns, "ip", "route", "add", "blackhole", hostIP+"/32")
	d := openT(t, srv.URL())
	before := time.Now()
	info, err := d.Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if info.Owner != "partitioned" || info.Remaining <= 0 {
		t.Fatalf("Inspect = %+v", info)
	}
	earliest := before.Add(info.Remaining)
	if _, err := d.AcquireWait(ctx, key, "waiter", time.Minute); err != nil {
		t.Fatalf("AcquireWait: %v", err)
	}
	granted := time.Now()
	t.Logf("partitioned holder's lock freed %v after its TTL ran out on the server", granted.Sub(earliest))
	if granted.Before(earliest) {
		t.Fatalf("the server freed the partitioned holder's lock %v before its TTL", earliest.Sub(granted))
	}
	// Heal: the holder, which presumed the lock lost at its deadline, is
	// told by the server that it is gone.
	heal()
	line := c.expect(t, "LOST ", 60*time.Second)
	if !strings.Contains(line, "notheld=true") {
		t.Fatalf("partitioned holder after healing: %s, want ErrNotHeld", line)
	}
	if err := d.Release(ctx, key, "waiter"); err != nil {
		t.Fatal(err)
	}
}
