package rueidis

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/internal/rediscore"
	"github.com/go-locker/locker/internal/redistest"
)

// Replies are converted to int64, string, []any (nested) or nil.
func TestConnRunReplies(t *testing.T) {
	s := redistest.Start(t)
	cl, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr}, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	c := &conn{client: cl, addr: s.Addr, owned: []rueidis.Client{cl}}
	defer c.Close()
	ctx := ctxT(t, 10*time.Second)
	script := &rediscore.Script{Name: "t", Src: `
if ARGV[1] == 'nil' then return nil end
if ARGV[1] == 'false' then return false end
if ARGV[1] == 'true' then return true end
if ARGV[1] == 'int' then return 42 end
if ARGV[1] == 'str' then return 'x' end
if ARGV[1] == 'status' then return {ok='OK'} end
return {1, 'a', {2, 'b'}}
`}
	for arg, want := range map[string]any{
		"nil": nil, "false": nil, "true": int64(1), "int": int64(42), "str": "x", "status": "OK",
		"arr": []any{int64(1), "a", []any{int64(2), "b"}},
	} {
		got, err := c.Run(ctx, script, nil, arg)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Run(%s) = %#v, %v; want %#v", arg, got, err, want)
		}
	}
	// A script error names the backend.
	bad := &rediscore.Script{Name: "bad", Src: `return redis.call('NOSUCHCMD')`}
	if _, err := c.Run(ctx, bad, nil); err == nil {
		t.Fatal("a failing script returned no error")
	}
	// A done ctx is wrapped.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Run(cctx, script, nil, "int"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run with a cancelled ctx: %v", err)
	}
	if err := c.Ping(cctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Ping with a cancelled ctx: %v", err)
	}
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	// Close is idempotent and closes the owned client.
	c.Close()
	c.Close()
	if err := cl.Do(ctx, cl.B().Ping().Build()).Error(); !errors.Is(err, rueidis.ErrClosing) {
		t.Fatalf("owned client still open after Close: %v", err)
	}
}
