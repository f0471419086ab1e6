package redis

import (
	"context"
	"errors"
	"net"
	"sync"

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
// caches the script, so the next EVALSHA hits). A refresh runs on the
// tracking connection of the key's server when there is one
// (tracker.refreshClient), and again on the Locker's client if it did not
// reach the script there (retryElsewhere).
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
	if s == rediscore.RefreshScript {
		if t := c.tr.refreshClient(ctx, keys[0]); t != nil {
			v, err := eval(ctx, t, rediscore.RefreshTrackedScript, keys, a)
			if err == nil {
				return c.tr.ownRefresh(keys[0], v), nil
			}
			if !retryElsewhere(ctx, err) {
				return nil, rediscore.MarkUnavailable(err)
			}
		}
	}
	v, err := eval(ctx, c.c, s, keys, a)
	if err != nil {
		return nil, rediscore.MarkUnavailable(err)
	}
	return v, nil
}

// eval runs s on cl: EVALSHA, then EVAL on NOSCRIPT; a nil reply is nil.
func eval(ctx context.Context, cl redis.Scripter, s *rediscore.Script, keys []string, a []any) (any, error) {
	v, err := cl.EvalSha(ctx, s.SHA, keys, a...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = cl.Eval(ctx, s.Src, keys, a...).Result()
	}
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// retryElsewhere reports whether a refresh that failed with err on a
// tracking connection is run again on the Locker's client: when ctx is not
// done and the script did not run, or may have run, for a reason of that
// connection (it broke or is being replaced, the server answered MOVED,
// ASK, TRYAGAIN or CLUSTERDOWN on a Cluster whose slots moved). A refresh
// may run twice: it is idempotent. A timeout is not retried: the server
// may be frozen, and a retry would double the time a call on
// context.Background() takes to fail (the client's read timeout).
func retryElsewhere(ctx context.Context, err error) bool {
	var nerr net.Error
	if ctx.Err() != nil || errors.As(err, &nerr) && nerr.Timeout() {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true
	}
	for _, p := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	return false
}

// RunBatch implements rediscore.Conn: one pipeline of EVALSHA (go-redis
// splits it by node on a Cluster and sends the parts in parallel), then
// one of EVAL for the calls that got NOSCRIPT. A batch of refreshes goes
// to the tracking connections of the keys' servers where there are some,
// one pipeline each, in parallel, and the calls that did not reach the
// script there to the Locker's client, as Run's.
func (c *conn) RunBatch(ctx context.Context, s *rediscore.Script, calls []rediscore.Call) []rediscore.Reply {
	out := make([]rediscore.Reply, len(calls))
	if s != rediscore.RefreshScript || c.tr == nil {
		batch(ctx, c.c, s, calls, out)
		return out
	}
	groups := map[*redis.Client][]int{}
	var rest []int
	for i, x := range calls {
		if t := c.tr.refreshClient(ctx, x.Keys[0]); t != nil {
			groups[t] = append(groups[t], i)
		} else {
			rest = append(rest, i)
		}
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for t, idx := range groups {
		wg.Go(func() {
			res := make([]rediscore.Reply, len(idx))
			batch(ctx, t, rediscore.RefreshTrackedScript, pick(calls, idx), res)
			mu.Lock()
			defer mu.Unlock()
			for j, i := range idx {
				switch r := res[j]; {
				case r.Err == nil:
					out[i] = rediscore.Reply{V: c.tr.ownRefresh(calls[i].Keys[0], r.V)}
				case retryElsewhere(ctx, r.Err):
					rest = append(rest, i)
				default:
					out[i] = r
				}
			}
		})
	}
	wg.Wait()
	if len(rest) > 0 {
		res := make([]rediscore.Reply, len(rest))
		batch(ctx, c.c, s, pick(calls, rest), res)
		for j, i := range rest {
			out[i] = res[j]
		}
	}
	return out
}

// pick returns the calls at the indexes idx, in that order.
func pick(calls []rediscore.Call, idx []int) []rediscore.Call {
	part := make([]rediscore.Call, len(idx))
	for j, i := range idx {
		part[j] = calls[i]
	}
	return part
}

// batch runs one call of s per element of calls on cl, in one pipeline of
// EVALSHA and one of EVAL for the calls that got NOSCRIPT; their replies
// go to out.
func batch(ctx context.Context, cl redis.UniversalClient, s *rediscore.Script, calls []rediscore.Call, out []rediscore.Reply) {
	cmds := pipeline(ctx, cl, calls, func(p redis.Pipeliner, x rediscore.Call, a []any) *redis.Cmd {
		return p.EvalSha(ctx, s.SHA, x.Keys, a...)
	})
	var retry []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			retry = append(retry, i)
			continue
		}
		out[i] = reply(cmd)
	}
	if len(retry) == 0 {
		return
	}
	cmds = pipeline(ctx, cl, pick(calls, retry), func(p redis.Pipeliner, x rediscore.Call, a []any) *redis.Cmd {
		return p.Eval(ctx, s.Src, x.Keys, a...)
	})
	for j, i := range retry {
		out[i] = reply(cmds[j])
	}
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
