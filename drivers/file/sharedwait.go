package file

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// Waiting for a shared hold. A waiting request is an entry in the lock's
// queue, in its file; whoever next rewrites the file under its flock (a
// release, a refresh, another waiter) grants the queue from its head as
// far as it fits. A waiter learns of its grant from inotify (the file was
// written), and of an expiry ahead of it from a timer at the first
// holder's expiry; it then re-reads the file, settling it itself (dropping
// expired holders, granting from the head) if nobody else has.
//
// While it waits, the waiter holds an exclusive flock on a waiter file of
// its own, named in its entry: a process that dies while waiting releases
// that flock, and the next settle drops its entry instead of granting it.

// sharedFallback is how long a waiter waits for an event before it re-reads
// its lock's file anyway, under a shared flock, and checks that the waiter
// at the head of the queue is alive: the bound on noticing a waiter ahead
// of it that died while nothing else happened. Releases, grants and
// expiries wake it at once.
const sharedFallback = 250 * time.Millisecond

// abandonTimeout bounds the clean-up of a wait that ended with its ctx:
// taking the flock to remove its entry, or its grant.
const abandonTimeout = 2 * time.Second

// sharedWaiter is one waiting request of this process.
type sharedWaiter struct {
	id   string // names its entry and its waiter file
	fd   int    // the waiter file, flocked while waiting
	path string
	sub  *subscription // events on the lock's file
	next time.Duration // until the first holder's lease ends, 0 if none
}

// newWaiter creates and flocks a waiter file for a request on the lock in
// file name, and subscribes to the events on that file. The entry naming
// it is written after, so that a waiter is alive whenever its entry is
// seen.
func (l *Locker) newWaiter(key, name string) (*sharedWaiter, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &sharedWaiter{id: hex.EncodeToString(b[:])}
	w.path = l.dir + "/" + waiterFileName(name, w.id)
	fd, err := unix.Open(w.path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, l.perm)
	if err != nil {
		return nil, fmt.Errorf("file: waiter file: %w", err)
	}
	w.fd = fd
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		w.drop()
		return nil, fmt.Errorf("file: waiter file: %w", err)
	}
	if w.sub, err = l.watchFile(key, l.dir+"/"+name, name); err != nil {
		w.drop()
		return nil, err
	}
	return w, nil
}

// drop removes the waiter file and its flock: the entry, if still queued,
// is dead from then on.
func (w *sharedWaiter) drop() {
	_ = unix.Unlink(w.path)
	unix.Close(w.fd)
}

// stop ends the wait's subscription and drops its waiter file.
func (w *sharedWaiter) stop() {
	w.sub.stop(false)
	w.drop()
}

// waitShared waits for the grant of the queued request w, re-reading the
// lock's file on each event, at the first holder's expiry, and after
// sharedFallback without either (every pollInterval without inotify), when
// it also checks that the waiter at the head of the queue is alive.
func (l *Locker) waitShared(ctx context.Context, key string, req driver.SharedRequest, w *sharedWaiter) (uint64, error) {
	defer w.stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d, expiry := sharedFallback, false
		if w.sub.w == nil {
			d = pollInterval
		}
		if w.next > 0 && w.next+100*time.Microsecond < d {
			d, expiry = w.next+100*time.Microsecond, true
		}
		timer.Reset(d)
		settle, probe := false, false
		select {
		case <-ctx.Done():
			return 0, l.abandonShared(ctx, key, req, w, fmt.Errorf("file: %w", ctx.Err()))
		case <-w.sub.done: // Close
			return 0, l.abandonShared(ctx, key, req, w, driver.ErrClosed)
		case <-w.sub.poke:
		case <-w.sub.wake:
		case <-timer.C:
			settle, probe = expiry, true
		}
		if !settle && l.stillWaiting(ctx, req, key, w, probe) {
			continue
		}
		if tok, done, err := l.checkWaiter(ctx, key, req, w); done {
			return tok, err
		}
	}
}

// stillWaiting reads the lock's file under a shared flock, so that the
// waiters woken by one write read it at once, and reports whether w is
// queued with nothing for it to settle: no expired holder, and a head that
// does not fit (and, with probe, whose waiter is alive). Otherwise (or if
// the file cannot be read now) w settles it under the exclusive flock.
func (l *Locker) stillWaiting(ctx context.Context, req driver.SharedRequest, key string, w *sharedWaiter, probe bool) bool {
	f, err := l.openShared(ctx, key, req.Mode.RW(), unix.LOCK_SH, false)
	if err != nil {
		return false
	}
	defer unix.Close(f.fd)
	at := now(l.boot)
	r := &f.rec
	if r.entry(w.id) < 0 || r.boot != at.boot {
		return false
	}
	for i := range r.holders {
		if r.holders[i].expires <= at.mono {
			return false
		}
	}
	head := r.queue[0]
	if r.holder(head.owner) >= 0 || r.fits(head.mode, head.limit) {
		return false
	}
	if probe && head.id != w.id && !l.waiterAlive(f.name, head.id) {
		return false
	}
	w.next = r.nextExpiry(at)
	return true
}

// checkWaiter settles the lock's file and reports whether w's wait is over:
// with its grant's token, or an error.
func (l *Locker) checkWaiter(ctx context.Context, key string, req driver.SharedRequest, w *sharedWaiter) (uint64, bool, error) {
	f, err := l.openShared(ctx, key, req.Mode.RW(), unix.LOCK_EX, true)
	if err != nil {
		if ctx.Err() != nil {
			return 0, false, nil // the wait loop sees ctx done
		}
		return 0, true, l.abandonShared(ctx, key, req, w, err)
	}
	at := now(l.boot)
	err = f.settle(ctx, at)
	var tok uint64
	var done bool
	if err == nil {
		tok, done, err = f.waiterState(w, req, at)
	}
	if ferr := f.finish(); err == nil {
		err = ferr
	}
	if err != nil {
		return 0, true, l.abandonShared(ctx, key, req, w, err)
	}
	return tok, done, nil
}

// waiterState reports whether w was granted (its token), refused (an
// upgrade), or waits on. A waiter found neither queued nor holding (its
// grant expired before it looked, or its entry was dropped) queues again.
func (f *sharedFile) waiterState(w *sharedWaiter, req driver.SharedRequest, at instant) (uint64, bool, error) {
	if f.rec.entry(w.id) >= 0 {
		w.next = f.rec.nextExpiry(at)
		return 0, false, nil
	}
	for _, h := range f.rec.holders {
		if h.via == w.id {
			return h.token, true, nil
		}
	}
	if i := f.rec.holder(req.Owner); i >= 0 {
		if h := f.rec.holders[i]; h.mode != req.Mode {
			return 0, true, upgradeErr(h.mode, req.Mode)
		}
		return f.rec.holders[i].token, true, nil
	}
	f.enqueue(w, req)
	w.next = f.rec.nextExpiry(at)
	return 0, false, nil
}

// abandonShared ends a wait that will not be granted: it removes w's entry,
// or undoes w's grant if it was made meanwhile, grants the waiters this
// lets in, and returns cause. Should the flock not be had within
// abandonTimeout, the entry is dropped by the next settle (w's waiter file
// is gone) and a grant made meanwhile expires after its TTL.
func (l *Locker) abandonShared(ctx context.Context, key string, req driver.SharedRequest, w *sharedWaiter, cause error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	f, err := l.openShared(cctx, key, req.Mode.RW(), unix.LOCK_EX, false)
	if err != nil {
		return cause
	}
	if i := f.rec.entry(w.id); i >= 0 {
		f.rec.queue = slices.Delete(f.rec.queue, i, i+1)
		f.dirty = true
	}
	if i := slices.IndexFunc(f.rec.holders, func(h sharedHolder) bool { return h.via == w.id }); i >= 0 {
		f.rec.holders = slices.Delete(f.rec.holders, i, i+1)
		f.dirty = true
	}
	_ = f.settle(cctx, now(l.boot)) // a writer leaving the head may let readers in
	_ = f.finish()
	return cause
}
