// Command etcdserver runs one etcd member for package etcdtest, in a process
// of its own, so a test can kill, stop and restart it as a real server.
//
// It prints "ready" on stdout once the member serves clients. It then reads
// commands on stdin, one per line: "status" answers "status <leader id>
// <member id>". It exits at once, as a crash would, when stdin closes (its
// parent died or killed it), and stops gracefully (a leader first hands
// leadership to a peer) on SIGTERM.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

func main() {
	name := flag.String("name", "m0", "member name")
	dir := flag.String("dir", "", "data directory")
	client := flag.String("client", "", "client URL")
	peer := flag.String("peer", "", "peer URL")
	initial := flag.String("initial", "", "initial-cluster string")
	fresh := flag.Bool("new", true, "start a new cluster (false: join the existing one with this member's data)")
	flag.Parse()
	if err := run(*name, *dir, *client, *peer, *initial, *fresh); err != nil {
		fmt.Fprintln(os.Stderr, "etcdserver:", err)
		os.Exit(1)
	}
}

func run(name, dir, client, peer, initial string, fresh bool) error {
	cu, err := url.Parse(client)
	if err != nil {
		return err
	}
	pu, err := url.Parse(peer)
	if err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name = name
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = initial
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = embed.ClusterStateFlagExisting
	if fresh {
		cfg.ClusterState = embed.ClusterStateFlagNew
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.Logger = "zap"
	cfg.LogOutputs = []string{"/dev/null"}
	// A member's crash here is a process's, never the host's: the page
	// cache keeps every write it made, so its fsyncs guard against nothing
	// a test stages, and they made raft wait on a disk shared with the
	// PostgreSQL servers of tests running beside it.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return err
	}
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	if err := out.Flush(); err != nil {
		os.Exit(2)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	go func() {
		<-term
		e.Close()
		os.Exit(0)
	}()
	go func() {
		err := <-e.Err()
		fmt.Fprintln(os.Stderr, "etcdserver: serve:", err)
		os.Exit(1)
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "status" {
			fmt.Fprintf(out, "status %d %d\n", e.Server.Leader(), e.Server.MemberID())
			if out.Flush() != nil {
				break
			}
		}
	}
	// The parent is gone, or closed stdin to kill this member: exit at
	// once, without a graceful stop.
	os.Exit(3)
	return nil
}
