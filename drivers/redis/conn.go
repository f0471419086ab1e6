package redis

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/rediscore"
)

// conn adapts a go-redis client to rediscore.Conn.
type conn struct {
	c    redis.UniversalClient
	owns bool // Close closes c only when the driver created it
}

var _ rediscore.Conn = (*conn)(nil)

// Run implements rediscore.Conn: EVALSHA, then EVAL on NOSCRIPT (EVAL also
// caches the script, so the next EVALSHA hits).
func (c *conn) Run(ctx context.Context, s *rediscore.Script, keys []string, args ...string) (any, error) {
	var a []any
	var buf [4]any
	if len(args) <= len(buf) {
		a = buf[:len(args)]
	} else {
		a = make([]any, len(args))
	}
	for i, x := range args {
		a[i] = x
	}
	v, err := c.c.EvalSha(ctx, s.SHA, keys, a...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = c.c.Eval(ctx, s.Src, keys, a...).Result()
	}
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, rediscore.MarkUnavailable(err)
	}
	return v, nil
}

// Ping implements rediscore.Conn.
func (c *conn) Ping(ctx context.Context) error {
	return rediscore.MarkUnavailable(c.c.Ping(ctx).Err())
}

// Close implements rediscore.Conn.
func (c *conn) Close() error {
	if !c.owns {
		return nil
	}
	return c.c.Close()
}

// doFunc returns a rediscore.DoFunc running one command on c.
func doFunc(c redis.UniversalClient) rediscore.DoFunc {
	return func(ctx context.Context, args ...string) (any, error) {
		a := make([]any, len(args))
		for i, x := range args {
			a[i] = x
		}
		v, err := c.Do(ctx, a...).Result()
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return v, rediscore.MarkUnavailable(err)
	}
}
