package rediscore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/redistest"
)

var keyCases = []string{"k", "a:b", "{", "}", "}{", "{}", "a}b", "x{y}z", "{user1}", "é ☃", "token", "k}:token"}

func TestKeysInjective(t *testing.T) {
	seen := map[string]string{}
	for _, k := range keyCases {
		lock, counter, ch := Keys("", k)
		if ch != lock {
			t.Errorf("%q: channel %q != lock %q", k, ch, lock)
		}
		for _, name := range []string{lock, counter} {
			if prev, ok := seen[name]; ok {
				t.Fatalf("%q and %q share the name %q", prev, k, name)
			}
			seen[name] = k
		}
	}
	if l, c, _ := Keys("app", "k"); l != "app:{k}" || c != "app:{k}:token" {
		t.Fatalf("Keys(app, k) = %q, %q", l, c)
	}
	// The layout is what servers hold: a key with braces is tagged by its
	// hex SHA1, and keys longer than LockKey's stack buffer come out alike.
	long := strings.Repeat("x", 300)
	for _, k := range []string{"a{b", long, long + "}"} {
		want := "app:{" + k + "}"
		if strings.ContainsAny(k, "{}") {
			sum := sha1.Sum([]byte(k))
			want = "app:{" + hex.EncodeToString(sum[:]) + "}:" + k
		}
		if l := LockKey("app", k); l != want {
			t.Fatalf("LockKey(app, %q) = %q, want %q", k, l, want)
		}
	}
}

func TestKeysSameSlotInCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	n := NewNode(testConn{c}, Options{})
	for _, k := range keyCases {
		lock, counter, _ := Keys("locker", k)
		s1, err := c.ClusterKeySlot(ctx, lock).Result()
		if err != nil {
			t.Fatal(err)
		}
		s2, _ := c.ClusterKeySlot(ctx, counter).Result()
		if s1 != s2 {
			t.Fatalf("%q: lock slot %d, counter slot %d", k, s1, s2)
		}
		// And the scripts run without CROSSSLOT.
		tok, err := n.Acquire(ctx, k, "o", 1e9)
		if err != nil || tok == 0 {
			t.Fatalf("%q: acquire on cluster: %d, %v", k, tok, err)
		}
		if err := n.Release(ctx, k, "o"); err != nil {
			t.Fatalf("%q: release on cluster: %v", k, err)
		}
	}
}
