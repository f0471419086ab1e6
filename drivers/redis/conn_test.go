package redis

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// Run loads a script on NOSCRIPT, maps a nil reply to nil, and Close
// closes only an owned client.
func TestConnRun(t *testing.T) {
	s := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr})
	defer c.Close()
	cn := &conn{c: c}
	ctx := context.Background()
	v, err := cn.Run(ctx, rediscore.InspectScript, []string{"locker:{free}"})
	if err != nil || v != nil {
		t.Fatalf("inspect of a free key: %v, %v (want nil, nil)", v, err)
	}
	if n, _ := s.Do("SCRIPT", "EXISTS", rediscore.InspectScript.SHA); n.([]any)[0] != int64(1) {
		t.Fatal("EVAL fallback did not load the script")
	}
	if err := cn.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cn.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Close closed a client it does not own: %v", err)
	}
	owned := &conn{c: goredis.NewClient(&goredis.Options{Addr: s.Addr}), owns: true}
	owned.Close()
	if err := owned.c.Ping(ctx).Err(); err == nil {
		t.Fatal("Close did not close an owned client")
	}
}
