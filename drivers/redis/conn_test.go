package redis

import (
	"context"
	"errors"
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

// A batch whose pipeline fails as a whole (the server cannot be reached,
// or a new connection's set-up fails) gives every call an error: no call
// reads as an answer, which for a refresh would mean "not held".
func TestConnRunBatchWholeFailure(t *testing.T) {
	s := redistest.Start(t)
	calls := []rediscore.Call{{Keys: []string{"locker:{a}", "q"}, Args: []string{"o", "1000", "ch", "w"}}, {Keys: []string{"locker:{b}", "q"}, Args: []string{"o", "1000", "ch", "w"}}}
	check := func(what string, c *goredis.Client) {
		t.Helper()
		defer c.Close()
		for i, r := range (&conn{c: c}).RunBatch(context.Background(), rediscore.RefreshScript, calls) {
			if r.Err == nil {
				t.Fatalf("%s: call %d: reply %v and no error", what, i, r.V)
			}
		}
	}
	check("set-up fails", goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1,
		OnConnect: func(context.Context, *goredis.Conn) error { return errors.New("set-up refused") }}))
	s.Kill()
	check("server unreachable", goredis.NewClient(&goredis.Options{Addr: s.Addr, MaxRetries: -1}))
}
