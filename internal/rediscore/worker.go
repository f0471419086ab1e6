package rediscore

import (
	"context"
	"sync"
	"time"
)

// workerIdle is how long a worker waits for its next call before it ends.
const workerIdle = 10 * time.Second

// job is one script run handed to a worker (see Node.start): the caller
// waits for done or for its ctx, whichever comes first, so that a client
// blocked on a silent server never holds its caller past ctx.
type job struct {
	ctx        context.Context
	s          *Script // nil: a PING
	keys, args []string
	detached   bool // run on ctx's values only, bounded by detachedTimeout or the Conn's own timeouts

	v    any
	err  error
	done chan struct{} // buffered 1; the send is the worker's last touch of the job
}

var jobs = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

// newJob returns a job from the pool.
func newJob(ctx context.Context, s *Script, keys, args []string, detached bool) *job {
	j := jobs.Get().(*job)
	j.ctx, j.s, j.keys, j.args, j.detached = ctx, s, keys, args, detached
	return j
}

// result returns j's outcome, once done was received, and puts j back in
// the pool. A job whose caller gave up is never put back.
func (j *job) result() (any, error) {
	v, err := j.v, j.err
	*j = job{done: j.done}
	jobs.Put(j)
	return v, err
}

// start hands j to an idle worker, or to a new one when none is idle.
// Workers outlive their call, so that a call costs a channel handoff, not
// a new goroutine whose stack grows through the client's call path each
// time. An idle worker is claimed (n.idle) before j is sent to it, so a
// caller that follows its own last call always finds that call's worker.
func (n *Node) start(j *job) {
	for {
		c := n.idle.Load()
		if c == 0 {
			n.workers.Add(1)
			go n.worker(j)
			return
		}
		if n.idle.CompareAndSwap(c, c-1) {
			n.jobs <- j
			return
		}
	}
}

// worker runs j, then each call handed to it, until it has been idle for
// workerIdle or the Node is closed.
func (n *Node) worker(j *job) {
	defer n.workers.Add(-1)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		n.exec(j)
		idle.Reset(workerIdle)
		select {
		case j = <-n.jobs: // start claimed this worker
			continue
		case <-idle.C:
		case <-n.done:
		}
		if !n.retire() {
			j = <-n.jobs // claimed just now: the job is on its way
		} else {
			return
		}
	}
}

// retire takes an idle worker off the count; false if every idle worker
// has been claimed meanwhile (one of them is this one: a job is on its way).
func (n *Node) retire() bool {
	for {
		c := n.idle.Load()
		if c == 0 {
			return false
		}
		if n.idle.CompareAndSwap(c, c-1) {
			return true
		}
	}
}

// exec runs j and signals its caller.
func (n *Node) exec(j *job) {
	ctx := j.ctx
	var cancel context.CancelFunc
	switch {
	case j.detached && n.timed:
		ctx = context.WithoutCancel(ctx)
	case j.detached:
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), n.detachedTimeout())
	}
	j.v, j.err = n.call(ctx, j.s, j.keys, j.args)
	if cancel != nil {
		cancel()
	}
	n.idle.Add(1) // before the caller hears: its next call finds this worker
	j.done <- struct{}{}
}

// call runs s (a PING when s is nil) on the caller's goroutine.
func (n *Node) call(ctx context.Context, s *Script, keys, args []string) (any, error) {
	if s == nil {
		return nil, n.c.Ping(ctx)
	}
	return n.c.Run(ctx, s, keys, args...)
}
