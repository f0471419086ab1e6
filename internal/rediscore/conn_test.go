package rediscore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// testConn is a minimal go-redis Conn for this package's tests (the real
// adapters live in drivers/redis and drivers/rueidis).
type testConn struct{ c redis.UniversalClient }

func (c testConn) Run(ctx context.Context, s *Script, keys []string, args ...string) (any, error) {
	a := make([]any, len(args))
	for i, x := range args {
		a[i] = x
	}
	v, err := c.c.EvalSha(ctx, s.SHA, keys, a...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = c.c.Eval(ctx, s.Src, keys, a...).Result()
	}
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

func (c testConn) Ping(ctx context.Context) error { return c.c.Ping(ctx).Err() }
func (c testConn) Close() error                   { return c.c.Close() }

func newTestConn(t *testing.T, addr string) testConn {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return testConn{c}
}

func TestParseToken(t *testing.T) {
	for v, want := range map[any]uint64{"1795969608844105": 1795969608844105, int64(7): 7} {
		if got, err := prefix("redis").parseToken(v); err != nil || got != want {
			t.Errorf("parseToken(%v) = %d, %v", v, got, err)
		}
	}
	for _, v := range []any{"x", int64(-1), nil, []any{}} {
		if _, err := prefix("redis").parseToken(v); err == nil {
			t.Errorf("parseToken(%v) succeeded", v)
		}
	}
}

func TestCtxErr(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := prefix("redis").ctxErr(ctx, "acquire", errors.New("i/o"))
	if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "redis: acquire") {
		t.Fatal(err)
	}
}

// RunBatch runs the calls one by one: enough for this package's tests.
func (c testConn) RunBatch(ctx context.Context, s *Script, calls []Call) []Reply {
	out := make([]Reply, len(calls))
	for i, x := range calls {
		out[i].V, out[i].Err = c.Run(ctx, s, x.Keys, x.Args...)
	}
	return out
}
