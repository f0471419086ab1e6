package etcd

import (
	"context"
	"errors"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepalives sends single lease renewals on a long-lived LeaseKeepAlive
// stream (one of kaStreams per Locker, chosen by lease ID: the server
// answers the requests of one stream one after the other, so several
// streams renew in parallel), instead of opening a stream per renewal as
// clientv3.Lease.KeepAliveOnce does. It never renews on its own: every
// renewal is one explicit request (from Acquire or Refresh), so a lock's
// lease never outlives what package locker believes about it.
//
// Requests are written by a sender goroutine of their own, never under mu:
// a write blocked by gRPC flow control (thousands of renewals in flight)
// must not stop the receiver from reading the answers that free the flow
// (TestKeepAliveFlood). Before this, one blocked write held mu, the
// receiver waited for mu, the server waited for the receiver, and every
// held lock's renewal missed its deadline.
type keepalives struct {
	mu      sync.Mutex
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	queue   []int64                   // lease IDs to send on stream, in order
	wake    chan struct{}             // tells the stream's sender the queue is not empty
	waiting map[int64][]chan kaResult // per lease, in request order
	sent    []time.Time               // when each unanswered request was queued, oldest first
}

// kaStall is how long the oldest unanswered request of a stream may wait
// before a renewal that gives up abandons the stream. The server answers a
// stream's requests one after the other, and one renewal can keep it busy
// for seconds (forwarded to a leader that is being elected, or waiting for
// the applied index): every renewal queued behind it would miss its
// deadline, though a new stream, on a new server handler and perhaps
// another member, answers at once.
const kaStall = 300 * time.Millisecond

// errStreamStalled ends a stream whose oldest request waited kaStall.
var errStreamStalled = errors.New("no answer within " + kaStall.String())

// kaStreams is the number of keepalive streams per Locker.
const kaStreams = 4

// kaFor returns the keepalive stream state that renews id.
func (l *Locker) kaFor(id clientv3.LeaseID) *keepalives {
	return &l.ka[uint64(id)%kaStreams]
}

type kaResult struct {
	ttl int64
	err error
}

// errStreamEnded is returned to renewals pending when the stream breaks.
var errStreamEnded = errors.New("lease keepalive stream ended")

// renew sends one keepalive for id and waits for its answer. It returns the
// lease's granted TTL in seconds, or an error for which isLeaseNotFound is
// true if the lease has expired or was revoked.
func (l *Locker) renew(ctx context.Context, id clientv3.LeaseID) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return awaitRenew(ctx, l.sendRenew(id))
}

// pendingRenew is a keepalive sent by sendRenew: its answer comes on ch.
type pendingRenew struct {
	ch <-chan kaResult
	ka *keepalives
	s  pb.Lease_LeaseKeepAliveClient // nil when no stream could be opened
}

// awaitRenew waits for the answer to a renewal sent by sendRenew. If ctx
// ends first and the stream's oldest request has waited kaStall, the
// stream is abandoned (see kaStall).
func awaitRenew(ctx context.Context, p pendingRenew) (int64, error) {
	select {
	case r := <-p.ch:
		return r.ttl, r.err
	case <-ctx.Done():
		// The answer, when it comes, goes to ch, which nobody reads.
		if p.s != nil {
			p.ka.abandonIfStalled(p.s)
		}
		return 0, ctx.Err()
	}
}

// abandonIfStalled ends stream s if its oldest request has waited kaStall.
func (ka *keepalives) abandonIfStalled(s pb.Lease_LeaseKeepAliveClient) {
	ka.mu.Lock()
	defer ka.mu.Unlock()
	if ka.stream == s && len(ka.sent) > 0 && time.Since(ka.sent[0]) >= kaStall {
		ka.endStream(s, errStreamStalled)
	}
}

// sendRenew queues one keepalive for id; its answer arrives on the returned
// channel. It never blocks on the network.
func (l *Locker) sendRenew(id clientv3.LeaseID) pendingRenew {
	ch := make(chan kaResult, 1)
	ka := l.kaFor(id)
	ka.mu.Lock()
	defer ka.mu.Unlock()
	if ka.stream == nil {
		sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(l.base))
		s, err := pb.NewLeaseClient(l.c.ActiveConnection()).LeaseKeepAlive(sctx)
		if err != nil {
			cancel()
			ch <- kaResult{err: err}
			return pendingRenew{ch: ch}
		}
		ka.stream, ka.cancel = s, cancel
		ka.queue, ka.wake = nil, make(chan struct{}, 1)
		if ka.waiting == nil {
			ka.waiting = make(map[int64][]chan kaResult)
		}
		go ka.recv(s)
		go ka.send(sctx, s, ka.wake)
	}
	ka.waiting[int64(id)] = append(ka.waiting[int64(id)], ch)
	ka.queue = append(ka.queue, int64(id))
	ka.sent = append(ka.sent, time.Now())
	select {
	case ka.wake <- struct{}{}:
	default:
	}
	return pendingRenew{ch: ch, ka: ka, s: ka.stream}
}

// send writes the queued requests of stream s until it ends. A
// write may block on flow control; mu is not held meanwhile.
func (ka *keepalives) send(ctx context.Context, s pb.Lease_LeaseKeepAliveClient, wake <-chan struct{}) {
	var batch []int64
	for {
		select {
		case <-wake:
		case <-ctx.Done():
			return
		}
		ka.mu.Lock()
		if ka.stream != s {
			ka.mu.Unlock()
			return
		}
		batch, ka.queue = ka.queue, batch[:0]
		ka.mu.Unlock()
		for _, id := range batch {
			if err := s.Send(&pb.LeaseKeepAliveRequest{ID: id}); err != nil {
				ka.mu.Lock()
				ka.endStream(s, err)
				ka.mu.Unlock()
				return
			}
		}
	}
}

func (ka *keepalives) recv(s pb.Lease_LeaseKeepAliveClient) {
	for {
		resp, err := s.Recv()
		ka.mu.Lock()
		if err != nil {
			ka.endStream(s, err)
			ka.mu.Unlock()
			return
		}
		if len(ka.sent) > 0 {
			ka.sent = ka.sent[1:] // answers come in request order
		}
		q := ka.waiting[resp.ID]
		if len(q) == 0 {
			ka.mu.Unlock()
			continue
		}
		ch := q[0]
		if len(q) == 1 {
			delete(ka.waiting, resp.ID)
		} else {
			ka.waiting[resp.ID] = q[1:]
		}
		ka.mu.Unlock()
		r := kaResult{ttl: resp.TTL}
		if resp.TTL <= 0 {
			r.err = rpctypes.ErrLeaseNotFound
		}
		ch <- r
	}
}

// endStream fails every pending renewal of stream s and forgets s, so the
// next renewal opens a new stream. ka.mu is held.
func (ka *keepalives) endStream(s pb.Lease_LeaseKeepAliveClient, err error) {
	if ka.stream != s {
		return
	}
	ka.cancel()
	ka.stream, ka.cancel = nil, nil
	ka.queue, ka.wake, ka.sent = nil, nil, nil
	if err == nil || errors.Is(err, context.Canceled) {
		err = errStreamEnded
	} else {
		err = errors.Join(errStreamEnded, rpctypes.Error(err))
	}
	for id, q := range ka.waiting {
		for _, ch := range q {
			ch <- kaResult{err: err}
		}
		delete(ka.waiting, id)
	}
}
