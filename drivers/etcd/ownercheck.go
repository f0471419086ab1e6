package etcd

import (
	"context"
	"errors"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Owner checks. Refresh reads the lock key before it renews the lease, to
// return ErrNotHeld for a key deleted or taken over. With thousands of
// locks held, one read per renewal is thousands of linearizable reads a
// second; instead, the reads of renewals that fall due together go to the
// server as one read-only transaction of up to maxCheckOps gets (etcd's
// default --max-txn-ops is 128), still linearizable, and each renewal gets
// the answer for its own key. A read joins only a batch that has not been
// sent yet, so every answer reflects the server after its Refresh began.

// maxCheckOps is the most gets in one owner-check transaction; halved,
// down to 1, when a server with a lower --max-txn-ops refuses a batch.
const maxCheckOps = 128

// maxCheckers bounds the owner-check transactions in flight at once.
const maxCheckers = 8

type ownerChecks struct {
	mu      sync.Mutex
	pending map[string][]chan checkResult // key → readers, not yet sent
	order   []string                      // pending keys, in arrival order
	running int                           // batches in flight
	maxOps  int                           // 0 means maxCheckOps
}

type checkResult struct {
	kv  *mvccpb.KeyValue // nil when the key does not exist
	err error
}

// readKey reads k linearizably, in a batch with other keys read at the
// same time. It returns nil if k does not exist.
func (l *Locker) readKey(ctx context.Context, k string) (*mvccpb.KeyValue, error) {
	ch := make(chan checkResult, 1)
	oc := &l.oc
	oc.mu.Lock()
	if oc.pending == nil {
		oc.pending = make(map[string][]chan checkResult)
	}
	if _, ok := oc.pending[k]; !ok {
		oc.order = append(oc.order, k)
	}
	oc.pending[k] = append(oc.pending[k], ch)
	// Every batch sender takes all that is pending when it starts one, so
	// a read that arrives while all of them are in flight needs another
	// (up to maxCheckers): it never waits for a batch it is not part of.
	start := oc.running < maxCheckers
	if start {
		oc.running++
	}
	oc.mu.Unlock()
	if start {
		go l.runChecks()
	}
	select {
	case r := <-ch:
		return r.kv, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (oc *ownerChecks) batchSize() int {
	if oc.maxOps == 0 {
		return maxCheckOps
	}
	return oc.maxOps
}

// runChecks sends batches until no key is pending.
func (l *Locker) runChecks() {
	oc := &l.oc
	for {
		oc.mu.Lock()
		if len(oc.order) == 0 {
			oc.running--
			oc.mu.Unlock()
			return
		}
		n := min(len(oc.order), oc.batchSize())
		keys := append([]string(nil), oc.order[:n]...)
		oc.order = oc.order[n:]
		readers := make([][]chan checkResult, n)
		for i, k := range keys {
			readers[i] = oc.pending[k]
			delete(oc.pending, k)
		}
		oc.mu.Unlock()
		l.checkBatch(keys, readers)
	}
}

// checkBatch reads keys in one transaction and answers each key's readers.
func (l *Locker) checkBatch(keys []string, readers [][]chan checkResult) {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpGet(k)
	}
	ctx, cancel := context.WithTimeout(l.base, l.requestTimeout)
	resp, err := l.c.Txn(ctx).Then(ops...).Commit()
	cancel()
	if err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyOps) && len(keys) > 1 {
		l.requeueChecks(keys, readers)
		return
	}
	for i, rs := range readers {
		r := checkResult{err: err}
		if err == nil {
			if kvs := resp.Responses[i].GetResponseRange().GetKvs(); len(kvs) > 0 {
				r.kv = kvs[0]
			}
		}
		for _, ch := range rs {
			ch <- r
		}
	}
}

// requeueChecks puts back a batch the server refused as too large, and
// halves the batch size.
func (l *Locker) requeueChecks(keys []string, readers [][]chan checkResult) {
	oc := &l.oc
	oc.mu.Lock()
	defer oc.mu.Unlock()
	oc.maxOps = max(1, len(keys)/2)
	for i, k := range keys {
		if _, ok := oc.pending[k]; !ok {
			oc.order = append(oc.order, k)
		}
		oc.pending[k] = append(readers[i], oc.pending[k]...)
	}
}
