package rueidis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/internal/rediscore"
)

// conn adapts a rueidis.Client to rediscore.Conn: one Redis deployment (a
// single node, a Cluster or a Sentinel-managed master) as the shared scripts
// see it.
type conn struct {
	client rueidis.Client // runs the scripts
	addr   string         // for error messages
	owned  []rueidis.Client

	// With client-side-caching waits on one node (not a Cluster), an
	// acquire attempt on a watched key that is not tracked any more runs on
	// the watch client, whose reads are tracked: the script's read of the
	// lock key re-arms the watch in the same round trip.
	watch rueidis.Client
	w     *cscWaiter

	// tracked: the watch client tracks with NOLOOP (see trackedOptions), so
	// refreshes run there too, and every script run there reads the lock
	// key again after writing it (AcquireTrackedScript,
	// RefreshTrackedScript): the key stays tracked across the owner's own
	// writes, which send this process no invalidation, and the hold watch
	// needs no read after them.
	tracked bool

	// m, when set, supplies client: a Redlock master that may be
	// reconnecting.
	m *master

	// timed: the clients were built with a ConnWriteTimeout in force (see
	// Timed).
	timed bool

	closeOnce sync.Once
}

var (
	_ rediscore.Conn      = (*conn)(nil)
	_ rediscore.TimedConn = (*conn)(nil)
)

// Timed implements rediscore.TimedConn: rueidis bounds the wait for each
// reply by the client's ConnWriteTimeout (10s by default). Open's clients
// have it, and NewWithClientOption's unless ConnWriteTimeout is negative
// (timedOption). A client adopted with New, whose options the driver
// cannot see, and a Redlock master are not reported timed.
func (c *conn) Timed() bool { return c.timed }

// scripts maps each shared script to its rueidis.Lua, which runs EVALSHA and
// falls back to EVAL (loading the script) on NOSCRIPT.
var scripts sync.Map // *rediscore.Script -> *rueidis.Lua

func luaFor(s *rediscore.Script) *rueidis.Lua {
	if l, ok := scripts.Load(s); ok {
		return l.(*rueidis.Lua)
	}
	l, _ := scripts.LoadOrStore(s, rueidis.NewLuaScript(s.Src))
	return l.(*rueidis.Lua)
}

// Run executes s by EVALSHA, falling back to EVAL on NOSCRIPT.
func (c *conn) Run(ctx context.Context, s *rediscore.Script, keys []string, args ...string) (any, error) {
	cl, err := c.cl()
	if err != nil {
		return nil, err
	}
	var resp rueidis.RedisResult
	tracked := false
	for try := 1; ; try++ {
		done, arm := c.w.wantsArm(keyOf(s, keys))
		arm = arm && c.watch != nil
		tracked = arm || (c.tracked && s == rediscore.RefreshScript)
		if tracked {
			resp = c.runTracked(ctx, s, keys, args)
		} else {
			resp = luaFor(s).Exec(ctx, cl, keys, args)
		}
		if arm {
			done(resp.NonRedisError() == nil)
		}
		err := resp.NonRedisError()
		if try == borrowedTries || !(borrowedCtxErr(ctx, err) || try == 1 && deadConn(ctx, err)) {
			break
		}
	}
	r := c.reply(ctx, resp)
	if tracked && r.Err == nil {
		r.V = c.ownWrite(s, keys[0], r.V)
	}
	return r.V, r.Err
}

// borrowedTries bounds the tries of a call that failed with another
// call's context error (see borrowedCtxErr).
const borrowedTries = 3

// borrowedCtxErr reports whether err is context.Canceled while ctx is not
// done: rueidis dials a connection on the context of the call that needs it
// first, and gives the calls waiting for that dial its outcome; when that
// call is cancelled, they fail with context.Canceled though their command
// was never sent. Such a call is tried again, on a new dial. (A
// DeadlineExceeded is not retried: rueidis also reports it for a
// connection that failed under a command already sent.)
func borrowedCtxErr(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(err, context.Canceled)
}

// deadConn reports whether err says the call's connection was dead (EOF,
// reset, broken pipe) while ctx is not done. rueidis hands that error to
// the first command sent on a connection the server closed, as after a
// restart, and then replaces the connection: the command never reached a
// live server, so it is tried once more, on a new connection. (Where the
// server ran it and then closed the connection, the second run answers as
// a second run does: an acquire or a refresh by the same owner succeeds
// again, a release reports the lock not held. go-redis retries on the same
// errors.)
func deadConn(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil &&
		(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE))
}

// keyOf returns the lock key an acquire attempt reads, or "".
func keyOf(s *rediscore.Script, keys []string) string {
	if s != rediscore.AcquireScript || len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// runTracked runs s on the watch client, whose connection tracks every key
// it reads (CLIENT TRACKING ON OPTOUT): the script's read of the lock key
// re-arms the watch. With NOLOOP (c.tracked) it runs the script's tracked
// variant, which reads the key again after writing it.
func (c *conn) runTracked(ctx context.Context, s *rediscore.Script, keys, args []string) rueidis.RedisResult {
	return luaFor(c.trackedScript(s)).Exec(ctx, c.watch, keys, args)
}

// trackedScript is the script run on the watch client in place of s.
func (c *conn) trackedScript(s *rediscore.Script) *rediscore.Script {
	if !c.tracked {
		return s
	}
	switch s {
	case rediscore.AcquireScript:
		return rediscore.AcquireTrackedScript
	case rediscore.RefreshScript:
		return rediscore.RefreshTrackedScript
	}
	return s
}

// ownWrite tells this process what NOLOOP kept from it after s (the
// script behind a tracked run, c.tracked) replied v for lock, and returns
// the reply s itself would have given. The key is still tracked (the
// tracked scripts read it last), so only local listeners need telling:
//   - an acquire that wrote the key (a grant: a string or an array): the
//     hold watch's entries of the key that were there before, such as the
//     last holder's or a change watch, read it again;
//   - a refresh that found the key not held (0; reading it may even have
//     expired it): those entries read it again, and the key's local
//     waiters wake;
//   - a refresh that shortened the TTL (2): the key's local waiters wake,
//     as other processes' do on the invalidation; the reply becomes 1.
func (c *conn) ownWrite(s *rediscore.Script, lock string, v any) any {
	if !c.tracked {
		return v
	}
	switch s {
	case rediscore.AcquireScript:
		switch v.(type) {
		case string, []any:
			c.w.invalidateHold(lock)
		}
	case rediscore.RefreshScript:
		switch n, _ := v.(int64); n {
		case 0:
			c.w.invalidateHold(lock)
			c.w.hub.Wake(lock)
		case 2:
			c.w.hub.Wake(lock)
			return int64(1)
		}
	}
	return v
}

// RunBatch implements rediscore.Conn: one DoMulti of EVALSHA (rueidis
// routes it by slot on a Cluster, one pipeline per node), then one of EVAL
// for the calls that got NOSCRIPT. Commands are pinned, as doFunc's. With
// c.tracked, a batch of refreshes runs on the watch client, as Run's
// refreshes do.
func (c *conn) RunBatch(ctx context.Context, s *rediscore.Script, calls []rediscore.Call) []rediscore.Reply {
	out := make([]rediscore.Reply, len(calls))
	cl, err := c.cl()
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	run := s
	tracked := c.tracked && s == rediscore.RefreshScript
	if tracked {
		cl, run = c.watch, c.trackedScript(s)
	}
	c.runBatch(ctx, cl, run, calls, out)
	if tracked {
		for i := range out {
			if out[i].Err == nil {
				out[i].V = c.ownWrite(s, calls[i].Keys[0], out[i].V)
			}
		}
	}
	return out
}

// runBatch is RunBatch on cl, its replies in out.
func (c *conn) runBatch(ctx context.Context, cl rueidis.Client, s *rediscore.Script, calls []rediscore.Call, out []rediscore.Reply) {
	cmds := make(rueidis.Commands, len(calls))
	for i, x := range calls {
		cmds[i] = cl.B().Evalsha().Sha1(s.SHA).Numkeys(int64(len(x.Keys))).Key(x.Keys...).Arg(x.Args...).Build().Pin()
	}
	var retry []int
	for i, r := range cl.DoMulti(ctx, cmds...) {
		if e, ok := rueidis.IsRedisErr(r.Error()); ok && e.IsNoScript() {
			retry = append(retry, i)
			continue
		}
		out[i] = c.reply(ctx, r)
	}
	if len(retry) == 0 {
		return
	}
	cmds = cmds[:0]
	for _, i := range retry {
		x := calls[i]
		cmds = append(cmds, cl.B().Eval().Script(s.Src).Numkeys(int64(len(x.Keys))).Key(x.Keys...).Arg(x.Args...).Build().Pin())
	}
	for j, r := range cl.DoMulti(ctx, cmds...) {
		out[retry[j]] = c.reply(ctx, r)
	}
}

// reply converts one result as Run does.
func (c *conn) reply(ctx context.Context, r rueidis.RedisResult) rediscore.Reply {
	msg, err := r.ToMessage()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return rediscore.Reply{}
		}
		return rediscore.Reply{Err: c.wrap(ctx, err)}
	}
	v, err := convert(&msg)
	return rediscore.Reply{V: v, Err: err}
}

// cl returns the client that runs the scripts.
func (c *conn) cl() (rueidis.Client, error) {
	if c.m != nil {
		return c.m.get()
	}
	return c.client, nil
}

// Ping makes one round trip.
func (c *conn) Ping(ctx context.Context) error {
	cl, err := c.cl()
	if err != nil {
		return err
	}
	if err := cl.Do(ctx, cl.B().Ping().Build().Pin()).Error(); err != nil {
		return c.wrap(ctx, err)
	}
	return nil
}

// Close closes the clients the conn owns.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		for _, cl := range c.owned {
			cl.Close()
		}
		if c.m != nil {
			c.m.close()
		}
	})
	return nil
}

// wrap names the backend and makes sure a done ctx shows in the error.
func (c *conn) wrap(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("rueidis: %s: %w (%v)", c.addr, cerr, err)
	}
	return rediscore.MarkUnavailable(fmt.Errorf("rueidis: %s: %w", c.addr, err))
}

// convert turns a reply into int64, string, []any (nested) or nil.
func convert(m *rueidis.RedisMessage) (any, error) {
	switch {
	case m.IsNil():
		return nil, nil
	case m.IsInt64():
		return m.AsInt64()
	case m.IsString():
		return m.ToString()
	case m.IsBool():
		b, err := m.AsBool()
		if err != nil || !b {
			return nil, err
		}
		return int64(1), nil
	case m.IsArray():
		arr, err := m.ToArray()
		if err != nil {
			return nil, err
		}
		out := make([]any, len(arr))
		for i := range arr {
			if out[i], err = convert(&arr[i]); err != nil {
				return nil, err
			}
		}
		return out, nil
	default:
		return m.ToAny()
	}
}

// doFunc returns a rediscore.DoFunc running one command on cl.
//
// Commands this driver sends are pinned (never returned to rueidis's pool):
// when a connection breaks, rueidis v1.0.79 retries a command on a new
// connection and then recycles it while the broken connection's writer may
// still have read it without synchronisation, which the race detector
// reports (found by conformance's Faults/Reset). A pinned command is left to
// the garbage collector instead. A map reply
// comes back as a map[string]string, a verbatim string (INFO) as a string.
func doFunc(cl rueidis.Client) rediscore.DoFunc {
	return func(ctx context.Context, args ...string) (any, error) {
		msg, err := cl.Do(ctx, cl.B().Arbitrary(args...).Build().Pin()).ToMessage()
		if err != nil {
			if rueidis.IsRedisNil(err) {
				return nil, nil
			}
			return nil, rediscore.MarkUnavailable(err)
		}
		if msg.IsMap() {
			return msg.AsStrMap()
		}
		if s, err := msg.ToString(); err == nil {
			return s, nil
		}
		return convert(&msg)
	}
}

// timedOption reports whether clients built from opt bound each reply's
// wait: ConnWriteTimeout 0 takes rueidis's default, a negative one none.
func timedOption(opt rueidis.ClientOption) bool { return opt.ConnWriteTimeout >= 0 }
