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
	// tr, when set, may run the refreshes on its tracking connection
	// (tracker.refreshClient).
	tr *tracker
}

var (
	_ rediscore.Conn      = (*conn)(nil)
	_ rediscore.TimedConn = (*conn)(nil)
)

// Timed implements rediscore.TimedConn: go-redis bounds each read and
// write by the client's ReadTimeout and WriteTimeout, when both are on.
func (c *conn) Timed() bool {
	switch x := c.c.(type) {
	case *redis.Client:
		o := x.Options()
		return o.ReadTimeout > 0 && o.WriteTimeout > 0
	case *redis.ClusterClient:
		o := x.Options()
		return o.ReadTimeout > 0 && o.WriteTimeout > 0
	}
	return false
}

// Run implements rediscore.Conn: EVALSHA, then EVAL on NOSCRIPT (EVAL also
// caches the script, so the next EVALSHA hits).
func (c *conn) Run(ctx context.Context, s *rediscore.Script, keys []string, args ...string) (any, error) {
	cl, run := c.c, s
	if s == rediscore.RefreshScript {
		if t := c.tr.refreshClient(); t != nil {
			cl, run = t, rediscore.RefreshTrackedScript
		}
	}
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
	v, err := cl.EvalSha(ctx, run.SHA, keys, a...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = cl.Eval(ctx, run.Src, keys, a...).Result()
	}
	if err != nil {
		if errors.Is(err, redis.Nil) {
			return nil, nil
		}
		return nil, rediscore.MarkUnavailable(err)
	}
	if run != s {
		v = c.tr.ownRefresh(keys[0], v)
	}
	return v, nil
}

// RunBatch implements rediscore.Conn: one pipeline of EVALSHA (go-redis
// splits it by node on a Cluster and sends the parts in parallel), then
// one of EVAL for the calls that got NOSCRIPT.
func (c *conn) RunBatch(ctx context.Context, s *rediscore.Script, calls []rediscore.Call) []rediscore.Reply {
	cl, run := c.c, s
	if s == rediscore.RefreshScript {
		if t := c.tr.refreshClient(); t != nil {
			cl, run = t, rediscore.RefreshTrackedScript
		}
	}
	out := make([]rediscore.Reply, len(calls))
	cmds := pipeline(ctx, cl, calls, func(p redis.Pipeliner, x rediscore.Call, a []any) *redis.Cmd {
		return p.EvalSha(ctx, run.SHA, x.Keys, a...)
	})
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			retry = append(retry, i)
			continue
		}
		out[i] = reply(cmd)
	}
	if len(retry) > 0 {
		again := make([]rediscore.Call, len(retry))
		for j, i := range retry {
			again[j] = calls[i]
		}
		cmds = pipeline(ctx, cl, again, func(p redis.Pipeliner, x rediscore.Call, a []any) *redis.Cmd {
			return p.Eval(ctx, run.Src, x.Keys, a...)
		})
		for j, i := range retry {
			out[i] = reply(cmds[j])
		}
	}
	if run != s {
		for i := range out {
			if out[i].Err == nil {
				out[i].V = c.tr.ownRefresh(calls[i].Keys[0], out[i].V)
			}
		}
	}
	return out
}

// pipeline queues one command per call, made by cmd, and executes them in
// one pipeline on cl.
func pipeline(ctx context.Context, cl redis.UniversalClient, calls []rediscore.Call, cmd func(redis.Pipeliner, rediscore.Call, []any) *redis.Cmd) []*redis.Cmd {
	p := cl.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, x := range calls {
		a := make([]any, len(x.Args))
		for j, v := range x.Args {
			a[j] = v
		}
		cmds[i] = cmd(p, x, a)
	}
	if err := wholeErr(p.Exec(ctx)); err != nil {
		for _, c := range cmds {
			if c.Err() == nil {
				c.SetErr(err)
			}
		}
	}
	return cmds
}

// wholeErr returns the error of a pipeline's Exec when the pipeline failed
// as a whole (no connection, say), nil when it ran: Exec then returns the
// first failed command's own error, and each command carries its own.
// go-redis does not always set the commands' errors when the pipeline
// fails as a whole, and a command left without reply or error must not
// read as an answer (an empty reply would read as "not held").
func wholeErr(cmds []redis.Cmder, err error) error {
	if err == nil {
		return nil
	}
	for _, c := range cmds {
		if c.Err() == err {
			return nil
		}
	}
	return err
}

// reply converts one pipelined command's outcome as Run does.
func reply(cmd *redis.Cmd) rediscore.Reply {
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return rediscore.Reply{}
	case err != nil:
		return rediscore.Reply{Err: rediscore.MarkUnavailable(err)}
	}
	return rediscore.Reply{V: v}
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
