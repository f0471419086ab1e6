package etcd

import (
	"context"
	"errors"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepalives sends single lease renewals on one long-lived LeaseKeepAlive
// stream per Locker, instead of opening a stream per renewal as
// clientv3.Lease.KeepAliveOnce does. It never renews on its own: every
// renewal is one explicit request (from Acquire or Refresh), so a lock's
// lease never outlives what package locker believes about it.
type keepalives struct {
	mu      sync.Mutex
	stream  pb.Lease_LeaseKeepAliveClient
	cancel  context.CancelFunc
	waiting map[int64][]chan kaResult // per lease, in request order
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

// awaitRenew waits for the answer to a renewal sent by sendRenew.
func awaitRenew(ctx context.Context, ch <-chan kaResult) (int64, error) {
	select {
	case r := <-ch:
		return r.ttl, r.err
	case <-ctx.Done():
		// The answer, when it comes, goes to ch, which nobody reads.
		return 0, ctx.Err()
	}
}

// sendRenew sends one keepalive for id; its answer arrives on the returned
// channel.
func (l *Locker) sendRenew(id clientv3.LeaseID) <-chan kaResult {
	ch := make(chan kaResult, 1)
	ka := &l.ka
	ka.mu.Lock()
	if ka.stream == nil {
		sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(l.base))
		s, err := pb.NewLeaseClient(l.c.ActiveConnection()).LeaseKeepAlive(sctx)
		if err != nil {
			cancel()
			ka.mu.Unlock()
			ch <- kaResult{err: err}
			return ch
		}
		ka.stream, ka.cancel = s, cancel
		if ka.waiting == nil {
			ka.waiting = make(map[int64][]chan kaResult)
		}
		go l.recvKeepAlives(s)
	}
	ka.waiting[int64(id)] = append(ka.waiting[int64(id)], ch)
	err := ka.stream.Send(&pb.LeaseKeepAliveRequest{ID: int64(id)})
	if err != nil {
		l.endStream(ka.stream, err)
	}
	ka.mu.Unlock()
	return ch
}

func (l *Locker) recvKeepAlives(s pb.Lease_LeaseKeepAliveClient) {
	ka := &l.ka
	for {
		resp, err := s.Recv()
		ka.mu.Lock()
		if err != nil {
			l.endStream(s, err)
			ka.mu.Unlock()
			return
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
// next renewal opens a new stream. l.ka.mu is held.
func (l *Locker) endStream(s pb.Lease_LeaseKeepAliveClient, err error) {
	ka := &l.ka
	if ka.stream != s {
		return
	}
	ka.cancel()
	ka.stream, ka.cancel = nil, nil
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
