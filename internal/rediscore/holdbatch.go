package rediscore

import (
	"context"
	"sync"
)

// HoldRead is one key's result of a HoldBatchReader: as a HoldReader's.
type HoldRead struct {
	Value  string
	Exists bool
	Err    error
}

// HoldBatchReader reads many lock keys as a HoldReader does (each on the
// tracking connection of the server serving it), in one round trip per
// server, and returns one HoldRead per key, in order.
type HoldBatchReader func(ctx context.Context, locks []string) []HoldRead

// holdQueue coalesces the re-reads of a HoldWatch: while one batch is on
// the wire, the re-reads that fall due wait, and go out together next.
// Every renewal of a watched lock invalidates its key, so a Locker that
// renews many locks in batches has their re-reads fall due together too.
type holdQueue struct {
	read    HoldBatchReader
	mu      sync.Mutex
	pending []*holdReq
	busy    bool // a drain is under way
}

type holdReq struct {
	lock string
	res  chan HoldRead // buffered: the drain never blocks
}

// SetBatchReader makes the watch read through r, coalescing the re-reads
// that fall due together (see holdQueue). Call it before the first Watch.
func (h *HoldWatch) SetBatchReader(r HoldBatchReader) {
	h.mu.Lock()
	h.batch = &holdQueue{read: r}
	h.mu.Unlock()
}

// readKey reads lock: through the batch reader when there is one, else
// with the HoldReader.
func (h *HoldWatch) readKey(ctx context.Context, lock string) (string, bool, error) {
	h.mu.Lock()
	q := h.batch
	h.mu.Unlock()
	if q == nil {
		return h.read(ctx, lock)
	}
	r := &holdReq{lock: lock, res: make(chan HoldRead, 1)}
	q.mu.Lock()
	q.pending = append(q.pending, r)
	start := !q.busy
	q.busy = true
	q.mu.Unlock()
	if start {
		h.wg.Add(1) // the caller's loop is counted: Close has not returned
		go func() {
			defer h.wg.Done()
			q.drain(h.life)
		}()
	}
	select {
	case x := <-r.res:
		return x.Value, x.Exists, x.Err
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

// drain reads the pending keys, one batch at a time, until none is left.
func (q *holdQueue) drain(life context.Context) {
	for {
		q.mu.Lock()
		batch := q.pending
		q.pending = nil
		if len(batch) == 0 {
			q.busy = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		locks := make([]string, len(batch))
		for i, r := range batch {
			locks[i] = r.lock
		}
		ctx, cancel := context.WithTimeout(life, holdReadTimeout)
		res := q.read(ctx, locks)
		cancel()
		for i, r := range batch {
			x := HoldRead{Err: errShortRead}
			if i < len(res) {
				x = res[i]
			}
			r.res <- x
		}
	}
}

var errShortRead = prefix("redis").errorf("hold watch: no result for this key in its batch")
