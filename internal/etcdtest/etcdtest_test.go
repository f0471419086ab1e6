package etcdtest

import (
	"context"
	"testing"
	"time"
)

func TestStartSingle(t *testing.T) {
	c := Start(t)
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "k")
	if err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("get: %v %v", r, err)
	}
	if c.Leader() != c.Members[0] {
		t.Fatal("single member is not leader")
	}
}

func TestClusterStopRestart(t *testing.T) {
	c := StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lead := c.Leader()
	if lead == nil {
		t.Fatal("no leader")
	}
	lead.Kill()
	if lead.Running() {
		t.Fatal("stopped member still running")
	}
	nl, err := c.WaitLeader(30 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if nl == lead {
		t.Fatal("stopped member is leader")
	}
	var others []*Member
	for _, m := range c.Members {
		if m != lead {
			others = append(others, m)
		}
	}
	cli := c.Client(t, others...)
	if _, err := cli.Put(ctx, "k", "after"); err != nil {
		t.Fatal(err)
	}
	if err := lead.Restart(); err != nil {
		t.Fatal(err)
	}
	// The restarted member catches up and serves the write made while it
	// was down.
	cli2 := c.Client(t, lead)
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := cli2.Get(ctx, "k")
		if err == nil && len(r.Kvs) == 1 && string(r.Kvs[0].Value) == "after" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("restarted member did not catch up: %v %v", r, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
