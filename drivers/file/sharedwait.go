package file

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// Waiting for a shared hold. A waiting request is an entry in the lock's
// queue, in its file; whoever next rewrites the file under its flock (a
// release, a refresh, another waiter) grants the queue from its head as
// far as it fits. Each waiter holds an exclusive flock on a waiter file of
// its own, named in its entry, opened read-only, and watches three things
// only (inotify on the directory, by file name):
//
//   - its own waiter file, which the writer of a grant writes a byte to
//     once the record is written (and so does the writer that makes it the
//     head of the queue, or removes the entry ahead of it);
//   - while it is at the head of the queue, a timer at the first holder's
//     expiry, which changes no file;
//   - otherwise, the closing of the waiter file of the live entry ahead of
//     it: its process closes that file when its wait ends, however it ends,
//     SIGKILL included. A waiter that finds the entry ahead dead and at the
//     head settles the record (dropping it); one that finds it dead further
//     back watches the next entry ahead instead.
//
// So a release wakes the waiters it grants (and a new head), and no other:
// nobody watches the lock's file itself. Without inotify every waiter
// re-reads the record every pollInterval.

// sharedFallback is how long a waiter waits for an event before it re-reads
// its lock's file anyway, under a shared flock, and checks that the entry
// ahead of it is alive: a bound on the effect of a lost event.
const sharedFallback = time.Second

// abandonTimeout bounds the clean-up of a wait that ended with its ctx:
// taking the flock to remove its entry, or its grant.
const abandonTimeout = 2 * time.Second

// sharedWaiter is one waiting request of this process.
type sharedWaiter struct {
	id     string // names its entry and its waiter file
	fd     int    // the waiter file, flocked while waiting
	path   string
	key    string
	name   string        // the lock's file name
	sub    *subscription // writes to its own waiter file
	pred   *subscription // closes of the waiter file of the entry ahead; nil if none
	predID string
	next   time.Duration // at the head: until the first holder's lease ends, 0 if none
}

// newWaiter creates and flocks a waiter file for a request on the lock in
// file name, and subscribes to the events on that file. The entry naming
// it is written after, so that a waiter is alive whenever its entry is
// seen. The file is opened read-only, so that its closing, and only its
// closing, is an IN_CLOSE_NOWRITE event (probes and wake-ups open it
// write-only).
func (l *Locker) newWaiter(key, name string) (*sharedWaiter, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	w := &sharedWaiter{id: hex.EncodeToString(b[:]), key: key, name: name}
	w.path = l.dir + "/" + waiterFileName(name, w.id)
	fd, err := unix.Open(w.path, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, l.perm)
	if err != nil {
		return nil, fmt.Errorf("file: waiter file: %w", err)
	}
	w.fd = fd
	flocks.Add(1)
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		w.drop()
		return nil, fmt.Errorf("file: waiter file: %w", err)
	}
	if w.sub, err = l.watchFile(key, w.path, waiterFileName(name, w.id), false); err != nil {
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

// stop ends the wait's subscriptions and drops its waiter file.
func (w *sharedWaiter) stop() {
	w.sub.stop(false)
	if w.pred != nil {
		w.pred.stop(false)
	}
	w.drop()
}

// watchPred makes w watch the waiter file of the entry id ahead of it
// ("" for none). It reports whether the watch changed.
func (w *sharedWaiter) watchPred(l *Locker, id string) bool {
	if id == w.predID {
		return false
	}
	if w.pred != nil {
		w.pred.stop(false)
		w.pred = nil
	}
	w.predID = id
	if id == "" {
		return true
	}
	name := waiterFileName(w.name, id)
	if s, err := l.watchFile(w.key, l.dir+"/"+name, name, true); err == nil {
		w.pred = s
	}
	return true
}

// track brings w's watches up to date with the record r (read under the
// lock's flock), in which w's entry is at index i: the expiry timer at the
// head, else the watch on the live entry ahead. probe also checks that the
// entry already watched is alive. It reports whether the record must be
// settled: the entry ahead is dead and at the head.
func (w *sharedWaiter) track(l *Locker, r *sharedRec, i int, at instant, probe bool) bool {
	w.next = 0
	if i == 0 {
		w.next = r.nextExpiry(at)
		w.watchPred(l, "")
		return false
	}
	for j := i - 1; j >= 0; j-- {
		id := r.queue[j].id
		if w.watchPred(l, id) {
			probe = true // it may have ended before the watch began
		}
		if !probe || l.waiterAlive(w.name, id) {
			return false
		}
		if j == 0 {
			return true
		}
	}
	return false
}

// predDied reports whether the waiter ahead of w, whose waiter file was
// just closed, died: its file is still there, and unlocked. A wait that
// ended otherwise removed its file first, and the write that ended it
// wakes w if that concerns w.
func (l *Locker) predDied(w *sharedWaiter) bool {
	fd, err := unix.Open(l.dir+"/"+waiterFileName(w.name, w.predID), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return !errors.Is(err, unix.ENOENT)
	}
	unix.Close(fd)
	return true
}

// A wakeUp is a waiter to wake, with the token of the hold granted to it,
// 0 if none.
type wakeUp struct {
	id    string
	token uint64
}

// wakeWaiters writes to the waiter file of each waiter f's write concerns,
// but the caller's own: those it granted (the token of the grant, so that
// the waiter need not read the record), the new head of the queue (which
// keeps the expiry timer), and those f.wake names otherwise ("-": look at
// the record).
func (f *sharedFile) wakeWaiters() {
	if q := f.rec.queue; len(q) > 0 && q[0].id != f.head {
		f.wake = append(f.wake, wakeUp{id: q[0].id})
	}
	var b [24]byte
	for _, w := range f.wake {
		if w.id == f.self {
			continue
		}
		fd, err := unix.Open(f.l.dir+"/"+waiterFileName(f.name, w.id), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // it has ended
		}
		msg := append(b[:0], '-')
		if w.token != 0 {
			msg = strconv.AppendUint(append(b[:0], 'g'), w.token, 10)
		}
		_, _ = unix.Pwrite(fd, append(msg, '\n'), 0)
		unix.Close(fd)
	}
}

// grantedToken returns the token a granter wrote to w's waiter file, or 0.
// A grant is written once, after the record that holds it, and only to a
// waiter that left the queue with it, so the file then says nothing else.
func (w *sharedWaiter) grantedToken() uint64 {
	var b [24]byte
	n, _ := unix.Pread(w.fd, b[:], 0)
	line, _, ok := strings.Cut(string(b[:max(n, 0)]), "\n")
	if !ok || !strings.HasPrefix(line, "g") {
		return 0
	}
	tok, _ := strconv.ParseUint(line[1:], 10, 64)
	return tok
}

// waitShared waits for the grant of the queued request w. It re-reads the
// lock's file when its waiter file is written, when the entry it watches
// closes its waiter file, at the first holder's expiry while at the head,
// and after sharedFallback without any of these (every pollInterval
// without inotify), when it also checks that the entry ahead is alive.
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
		var pred <-chan struct{}
		if w.pred != nil {
			pred = w.pred.poke
		}
		settle, probe := false, false
		select {
		case <-ctx.Done():
			return 0, l.abandonShared(ctx, key, req, w, fmt.Errorf("file: %w", ctx.Err()))
		case <-w.sub.done: // Close
			return 0, l.abandonShared(ctx, key, req, w, driver.ErrClosed)
		case <-w.sub.poke:
			if tok := w.grantedToken(); tok != 0 {
				return tok, nil
			}
		case <-w.sub.wake:
		case <-pred:
			if !l.predDied(w) {
				continue
			}
			probe = true
		case <-timer.C:
			settle, probe = expiry, !expiry
		}
		if !settle {
			tok, state := l.observe(ctx, req, key, w, probe)
			if state == wasGranted {
				return tok, nil
			}
			if state == stillQueued {
				continue
			}
		}
		if tok, done, err := l.checkWaiter(ctx, key, req, w); done {
			return tok, err
		}
	}
}

// What observe found.
const (
	stillQueued = iota // w waits on, with nothing to settle
	wasGranted         // w holds
	unsettled          // w must settle the record under the exclusive flock
)

// observe reads the lock's file under a shared flock, so that the waiters
// woken by one write read it at once, and reports whether w was granted,
// waits on with nothing to settle (no expired holder, a head that does not
// fit, and a live entry ahead of w), or must settle the record (also if
// the file cannot be read now).
func (l *Locker) observe(ctx context.Context, req driver.SharedRequest, key string, w *sharedWaiter, probe bool) (uint64, int) {
	f, err := l.openShared(ctx, key, req.Mode.RW(), unix.LOCK_SH, false)
	if err != nil {
		return 0, unsettled
	}
	defer unix.Close(f.fd)
	at := now(l.boot)
	r := &f.rec
	if r.boot != at.boot {
		return 0, unsettled
	}
	for i := range r.holders {
		if r.holders[i].via == w.id {
			return r.holders[i].token, wasGranted
		}
		if r.holders[i].expires <= at.mono {
			return 0, unsettled
		}
	}
	i := r.entry(w.id)
	if i < 0 {
		return 0, unsettled
	}
	head := r.queue[0]
	if r.holder(head.owner) >= 0 || r.fits(head.mode, head.limit) || w.track(l, r, i, at, probe) {
		return 0, unsettled
	}
	return 0, stillQueued
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
	f.self = w.id
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
// upgrade), or waits on, then with its watches brought up to date. A
// waiter found neither queued nor holding (its grant expired before it
// looked, or its entry was dropped) queues again, as a new waiter.
func (f *sharedFile) waiterState(w *sharedWaiter, req driver.SharedRequest, at instant) (uint64, bool, error) {
	if i := f.rec.entry(w.id); i >= 0 {
		if w.track(f.l, &f.rec, i, at, false) {
			signal(w.sub.poke) // the head died since settle saw it: look again
		}
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
	// Queue again under a new waiter file: a grant written to the old one
	// (since expired) must not be read as this entry's.
	nw, err := f.l.newWaiter(w.key, w.name)
	if err != nil {
		return 0, true, err
	}
	w.stop()
	*w = *nw
	f.self = w.id
	f.enqueue(w, req)
	if w.track(f.l, &f.rec, len(f.rec.queue)-1, at, false) {
		signal(w.sub.poke)
	}
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
		if i > 0 && i < len(f.rec.queue) {
			f.wake = append(f.wake, wakeUp{id: f.rec.queue[i].id}) // the entry it watched ahead has gone
		}
	}
	if i := slices.IndexFunc(f.rec.holders, func(h sharedHolder) bool { return h.via == w.id }); i >= 0 {
		f.rec.holders = slices.Delete(f.rec.holders, i, i+1)
		f.dirty = true
	}
	_ = f.settle(cctx, now(l.boot)) // a writer leaving the head may let readers in
	_ = f.finish()
	return cause
}
