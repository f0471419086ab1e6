package locker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/go-locker/locker/driver"
)

// Batching of automatic renewals (driver.BatchRefresher).
//
// Each Lock keeps its own renewal schedule, its own safe deadline and its
// own timer: the batcher only changes how a renewal reaches the driver.
// A renewal that falls due joins the Locker's pending batch, which is sent
// batchWindow after its first renewal arrived (sooner for short TTLs: a
// TTL/64 at most), or at once when it holds batchMax renewals. Each
// renewal waits for its own result, or for its own context (the renewal's
// timeout, the lock ending), whichever comes first, so that a batch that
// stalls delays no lock past its own timeout and deadline.
const (
	batchWindow = 2 * time.Millisecond
	batchMax    = 1024
)

// batcher collects the automatic renewals of one Locker's locks into
// driver.BatchRefresher calls.
type batcher struct {
	l  *Locker
	br driver.BatchRefresher

	mu      sync.Mutex
	pending []*renewal
	due     time.Time // when the pending batch is sent
	timer   *time.Timer
	gate    chan struct{} // tests (HoldBatches): flush waits until it is closed
}

// renewal is one lock's renewal waiting in, or sent with, a batch.
type renewal struct {
	item driver.RefreshItem
	ctx  context.Context
	res  chan renewalResult // buffered: the sender never blocks
}

type renewalResult struct {
	sent time.Time // when the batch was handed to the driver; zero if it was not
	err  error
}

func newBatcher(l *Locker, br driver.BatchRefresher) *batcher {
	return &batcher{l: l, br: br}
}

// refresh renews key for owner with ttl as part of a batch. It returns when
// the batch has answered for this lock, or when ctx is done; sent is when
// the batch was handed to the driver (the earliest the server can have
// started the new TTL), zero if it was not.
func (b *batcher) refresh(ctx context.Context, key, owner string, ttl time.Duration) (sent time.Time, err error) {
	r := &renewal{item: driver.RefreshItem{Key: key, Owner: owner, TTL: ttl}, ctx: ctx, res: make(chan renewalResult, 1)}
	b.add(r)
	select {
	case x := <-r.res:
		return x.sent, x.err
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
}

// add puts r in the pending batch, and sends the batch now if it is full.
func (b *batcher) add(r *renewal) {
	due := time.Now().Add(min(batchWindow, r.item.TTL/64))
	b.mu.Lock()
	b.pending = append(b.pending, r)
	if len(b.pending) >= batchMax {
		batch := b.takeLocked()
		b.mu.Unlock()
		go b.send(batch)
		return
	}
	if len(b.pending) == 1 || due.Before(b.due) {
		b.due = due
		if b.timer == nil {
			b.timer = time.AfterFunc(time.Until(due), b.flush)
		} else {
			b.timer.Reset(time.Until(due))
		}
	}
	b.mu.Unlock()
}

// takeLocked empties the pending batch and returns it. b.mu is held.
func (b *batcher) takeLocked() []*renewal {
	batch := b.pending
	b.pending = nil
	return batch
}

// flush sends the pending batch, if any (the timer's function).
func (b *batcher) flush() {
	b.mu.Lock()
	if g := b.gate; g != nil {
		b.mu.Unlock()
		<-g
		b.mu.Lock()
	}
	batch := b.takeLocked()
	b.mu.Unlock()
	if len(batch) > 0 {
		b.send(batch)
	}
}

// send hands batch to the driver in one call and gives each renewal its own
// result. Renewals whose context is done (the lock ended, the renewal timed
// out) are left out. The call runs until the latest renewal's deadline, and
// ends when Close has released the locks.
func (b *batcher) send(batch []*renewal) {
	live := batch[:0]
	var last time.Time
	endless := false
	for _, r := range batch {
		if err := r.ctx.Err(); err != nil {
			r.res <- renewalResult{err: err}
			continue
		}
		d, ok := r.ctx.Deadline()
		endless = endless || !ok
		if d.After(last) {
			last = d
		}
		live = append(live, r)
	}
	if len(live) == 0 {
		return
	}
	if !b.l.enter(true) {
		for _, r := range live {
			r.res <- renewalResult{err: ErrClosed}
		}
		return
	}
	defer b.l.exit()
	ctx, cancel := b.l.grace, context.CancelFunc(func() {})
	if !endless {
		ctx, cancel = context.WithDeadline(b.l.grace, last)
	}
	defer cancel()
	items := make([]driver.RefreshItem, len(live))
	for i, r := range live {
		items[i] = r.item
	}
	sent := time.Now()
	errs := b.br.RefreshBatch(ctx, items)
	for i, r := range live {
		err := errBatchShort
		if i < len(errs) {
			err = errs[i]
		}
		r.res <- renewalResult{sent: sent, err: err}
	}
}

// errBatchShort is a renewal's error when the driver's RefreshBatch
// returned fewer results than it was given items: transient, so the
// renewal is retried.
var errBatchShort = errors.New("driver returned no result for this renewal in its batch")
