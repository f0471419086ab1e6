package rediscore

import (
	"context"
	"fmt"

	"github.com/go-locker/locker/driver"
)

// Call is one call of a script in a batch (Conn.RunBatch).
type Call struct {
	Keys []string
	Args []string
}

// Reply is the outcome of one Call: a reply as Conn.Run converts it, or
// the call's error.
type Reply struct {
	V   any
	Err error
}

// refreshCall is the RefreshScript call that refreshes key for owner.
func refreshCall(pfx, key, owner, ms string) Call {
	lock := LockKey(pfx, key)
	ch := lock
	ql, _ := QueueKeys(lock)
	return Call{Keys: []string{lock, ql}, Args: []string{owner, ms, ch, WakeChannel(pfx, "")}}
}

// refreshed turns a RefreshScript reply into Refresh's result: nil when
// refreshed, ErrNotHeld otherwise.
func (p prefix) refreshed(ctx context.Context, r any, err error) error {
	if err != nil {
		return p.ctxErr(ctx, "refresh", err)
	}
	if v, _ := asInt(r); v != 1 {
		return p.errorf("refresh: %w", driver.ErrNotHeld)
	}
	return nil
}

// batchArgs checks each item as Refresh does (errs[i] set for a bad one)
// and returns the calls of the good ones and their indexes in items.
func (p prefix) batchArgs(ctx context.Context, closed bool, o Options, c driver.Capabilities, items []driver.RefreshItem, errs []error) ([]Call, []int) {
	calls := make([]Call, 0, len(items))
	idx := make([]int, 0, len(items))
	for i, it := range items {
		if errs[i] = p.checkCall(ctx, closed, o.MaxKeyLen, it.Key, it.Owner, it.TTL, true, true); errs[i] != nil {
			continue
		}
		calls = append(calls, refreshCall(o.Prefix, it.Key, it.Owner, ttlMS(c, it.TTL)))
		idx = append(idx, i)
	}
	return calls, idx
}

// RefreshBatch implements driver.BatchRefresher: one RefreshScript call per
// item, all in one pipeline (one round trip; on a Cluster, one per node,
// sent in parallel). Each item's result is Refresh's for it alone.
func (n *Node) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	errs := make([]error, len(items))
	calls, idx := n.p.batchArgs(ctx, n.closed.Load(), n.o, n.Capabilities(), items, errs)
	if len(calls) == 0 {
		return errs
	}
	replies := n.runBatch(ctx, RefreshScript, calls)
	for j, i := range idx {
		errs[i] = n.p.refreshed(ctx, replies[j].V, replies[j].Err)
	}
	return errs
}

// runBatch is c.RunBatch that returns promptly once ctx is done, even if
// the client does not watch ctx (the batch then finishes in the
// background): every reply is then ctx.Err().
func (n *Node) runBatch(ctx context.Context, s *Script, calls []Call) []Reply {
	if ctx.Done() == nil {
		return n.c.RunBatch(ctx, s, calls)
	}
	ch := make(chan []Reply, 1)
	go func() { ch <- n.c.RunBatch(ctx, s, calls) }()
	select {
	case r := <-ch:
		return r
	case <-ctx.Done():
		r := make([]Reply, len(calls))
		for i := range r {
			r[i].Err = ctx.Err()
		}
		return r
	}
}

// RefreshBatch implements driver.BatchRefresher: every node gets the whole
// batch in one pipeline, all nodes in parallel, each bounded by
// NodeTimeout; then each item is decided on its own, exactly as Refresh
// decides (a quorum of nodes refreshed it, or ErrNotHeld, or an error
// naming the counts).
func (r *Redlock) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	errs := make([]error, len(items))
	calls, idx := r.p.batchArgs(ctx, r.closed.Load(), r.o, r.Capabilities(), items, errs)
	if len(calls) == 0 {
		return errs
	}
	perNode := r.eachBatch(ctx, RefreshScript, calls)
	res := make([]result, len(r.conns))
	for j, i := range idx {
		for k := range res {
			res[k] = result{perNode[k][j].V, perNode[k][j].Err}
		}
		errs[i] = r.refreshTally(ctx, res)
	}
	return errs
}

// eachBatch runs calls as one batch on every node in parallel, each bounded
// by NodeTimeout (and ctx), and returns each node's replies. A node that did
// not answer in time gets an error wrapping context.DeadlineExceeded on
// every call.
func (r *Redlock) eachBatch(ctx context.Context, s *Script, calls []Call) [][]Reply {
	type msg struct {
		i int
		r []Reply
	}
	ch := make(chan msg, len(r.conns))
	ctx, cancel := context.WithTimeout(ctx, r.o.NodeTimeout)
	defer cancel()
	for i, c := range r.conns {
		go func() { ch <- msg{i, c.RunBatch(ctx, s, calls)} }()
	}
	out := make([][]Reply, len(r.conns))
	for range r.conns {
		select {
		case m := <-ch:
			out[m.i] = m.r
		case <-ctx.Done():
			for i := range out {
				if out[i] == nil {
					out[i] = make([]Reply, len(calls))
					err := fmt.Errorf("node %d: no answer within node_timeout %v: %w", i, r.o.NodeTimeout, ctx.Err())
					for j := range out[i] {
						out[i][j].Err = err
					}
				}
			}
			return out
		}
	}
	return out
}

// RefreshBatch implements driver.BatchRefresher: one pipeline on one
// deployment, one per master in parallel under Redlock (see
// Node.RefreshBatch and Redlock.RefreshBatch). Errors per item as for
// Refresh.
func (l *Locker) RefreshBatch(ctx context.Context, items []driver.RefreshItem) []error {
	if l.node != nil {
		return l.node.RefreshBatch(ctx, items)
	}
	return l.redlock.RefreshBatch(ctx, items)
}
