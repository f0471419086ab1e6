package file

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// Shared holds (driver.SharedLocker): semaphores and read-write locks. See
// the package documentation, "Semaphores and read-write locks", for the
// design; sharedrecord.go for the file format.

var _ driver.SharedLocker = (*Locker)(nil)

// sharedFile is a shared lock's file, open and flocked for one operation,
// with its record as read.
type sharedFile struct {
	l     *Locker
	fd    int
	name  string // file name in l.dir
	rec   sharedRec
	buf   []byte
	fresh bool     // the file was empty when opened
	dirty bool     // rec was changed and is written by finish
	head  string   // the id of the waiter at the head of the queue when opened
	self  string   // the id of the waiter making this call, if one is
	wake  []wakeUp // the waiters to wake once the record is written
}

func checkShared(mode driver.SharedMode) error {
	if err := driver.CheckMode(mode); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

func checkRequest(req driver.SharedRequest) error {
	if err := checkShared(req.Mode); err != nil {
		return err
	}
	if err := driver.CheckLimit(req); err != nil {
		return fmt.Errorf("file: %w", err)
	}
	return nil
}

func upgradeErr(held, want driver.SharedMode) error {
	return fmt.Errorf("file: %w: the owner holds the %s lock and asks for the %s lock; "+
		"there are no upgrades or downgrades: release it first", driver.ErrInvalid, held, want)
}

// openShared opens and flocks (how: unix.LOCK_EX or unix.LOCK_SH) the file
// of the semaphore (rw false) or read-write lock (rw true) on key. With
// create false a missing file is unix.ENOENT, unwrapped.
func (l *Locker) openShared(ctx context.Context, key string, rw bool, how int, create bool) (*sharedFile, error) {
	name := sharedFileName(key, rw)
	fd, err := flockFile(ctx, l.dir+"/"+name, how, create, l.perm)
	if errors.Is(err, unix.ENOENT) && !create {
		return nil, err
	}
	if err != nil {
		return nil, lockErr(ctx, err)
	}
	f := &sharedFile{l: l, fd: fd, name: name}
	var arr [512]byte
	if f.rec, f.buf, err = readShared(fd, arr[:0]); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f.fresh = len(f.buf) == 0
	switch f.rec.key {
	case "":
		f.rec = sharedRec{boot: l.boot, floor: f.rec.floor, key: key}
	case key:
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("file: key %q collides with key %q in %s", key, f.rec.key, name)
	}
	if len(f.rec.queue) > 0 {
		f.head = f.rec.queue[0].id
	}
	return f, nil
}

// finish writes the record if it changed, and closes the file. A file
// created for an operation that wrote nothing is removed. Once the file is
// closed, it wakes the waiters the write concerns: those it granted, and a
// new head of the queue (see wakeWaiters).
func (f *sharedFile) finish() error {
	if !f.dirty {
		if f.fresh {
			_ = unix.Unlink(f.l.dir + "/" + f.name)
		}
		unix.Close(f.fd)
		return nil
	}
	err := writeShared(f.fd, &f.rec, f.buf)
	unix.Close(f.fd)
	if err == nil {
		f.wakeWaiters()
	}
	return err
}

// settle drops the expired holders and the dead waiters at the head of the
// queue, and grants the queue from its head for as long as its head fits:
// a run of readers, one writer, or permits while they last.
func (f *sharedFile) settle(ctx context.Context, at instant) error {
	if f.rec.expire(at) {
		f.dirty = true
	}
	for len(f.rec.queue) > 0 {
		e := f.rec.queue[0]
		if i := f.rec.holder(e.owner); i >= 0 {
			// The owner was granted a hold by another call meanwhile: the
			// waiter takes it if it is of its mode, or fails (no upgrades).
			if f.rec.holders[i].mode == e.mode {
				f.rec.holders[i].expires = at.mono + int64(e.ttl)
			}
			f.wake = append(f.wake, wakeUp{id: e.id})
		} else if !f.l.waiterAlive(f.name, e.id) {
			// Its process died while waiting.
		} else if f.rec.fits(e.mode, e.limit) {
			tok, err := f.grant(ctx, e.owner, e.mode, e.ttl, e.id, at)
			if err != nil {
				return err
			}
			f.wake = append(f.wake, wakeUp{id: e.id, token: tok})
		} else {
			return nil
		}
		f.rec.queue = f.rec.queue[1:]
		f.dirty = true
	}
	return nil
}

// grant makes a new hold with the next token, granted to the waiter via
// ("" for a grant made at once).
func (f *sharedFile) grant(ctx context.Context, owner string, mode driver.SharedMode, ttl time.Duration, via string, at instant) (uint64, error) {
	tok, err := f.l.nextToken(ctx, f.rec.floor)
	if err != nil {
		return 0, lockErr(ctx, err)
	}
	f.rec.floor = tok
	f.rec.holders = append(f.rec.holders, sharedHolder{token: tok, mode: mode, expires: at.mono + int64(ttl), via: via, owner: owner})
	f.dirty = true
	return tok, nil
}

// heldBy returns the index of owner's live hold in mode, or -1.
func (f *sharedFile) heldBy(owner string, mode driver.SharedMode, at instant) int {
	i := f.rec.holder(owner)
	if i < 0 || f.rec.holders[i].mode != mode || f.rec.remaining(&f.rec.holders[i], at) <= 0 {
		return -1
	}
	return i
}

// AcquireShared implements driver.SharedLocker: one read-modify-write of
// the lock's file under its flock grants the hold, or queues the request
// (req.Wait), which then waits for its grant as described in the package
// documentation. A refused one-shot request gets a *driver.HeldError with
// the remaining TTL of the first holder to expire, or driver.ErrNotAcquired
// if only waiters are in the way.
func (l *Locker) AcquireShared(ctx context.Context, key string, req driver.SharedRequest) (uint64, error) {
	if err := checkRequest(req); err != nil {
		return 0, err
	}
	if err := l.check(ctx, key, req.Owner, req.TTL, true); err != nil {
		return 0, err
	}
	f, err := l.openShared(ctx, key, req.Mode.RW(), unix.LOCK_EX, true)
	if err != nil {
		return 0, err
	}
	tok, w, err := f.acquire(ctx, key, req)
	if ferr := f.finish(); err == nil && ferr != nil {
		err = ferr
		if w != nil {
			w.stop()
		}
	}
	if err != nil || w == nil {
		return tok, err
	}
	return l.waitShared(ctx, key, req, w)
}

// acquire is AcquireShared on the open file: it grants the hold, refuses
// it, or queues req and returns its waiter.
func (f *sharedFile) acquire(ctx context.Context, key string, req driver.SharedRequest) (uint64, *sharedWaiter, error) {
	at := now(f.l.boot)
	if err := f.settle(ctx, at); err != nil {
		return 0, nil, err
	}
	if i := f.rec.holder(req.Owner); i >= 0 {
		h := &f.rec.holders[i]
		if h.mode != req.Mode {
			return 0, nil, upgradeErr(h.mode, req.Mode)
		}
		h.expires = at.mono + int64(req.TTL)
		f.dirty = true
		return h.token, nil, nil
	}
	if err := ctxErr(ctx); err != nil {
		return 0, nil, err
	}
	if len(f.rec.queue) == 0 && f.rec.fits(req.Mode, req.Limit) {
		tok, err := f.grant(ctx, req.Owner, req.Mode, req.TTL, "", at)
		return tok, nil, err
	}
	if !req.Wait {
		return 0, nil, f.rec.soonest(at)
	}
	w, err := f.l.newWaiter(key, f.name)
	if err != nil {
		return 0, nil, err
	}
	f.self = w.id
	f.enqueue(w, req)
	if w.track(f.l, &f.rec, len(f.rec.queue)-1, at, false) {
		signal(w.sub.poke) // the entry ahead died: settle at once
	}
	return 0, w, nil
}

func (f *sharedFile) enqueue(w *sharedWaiter, req driver.SharedRequest) {
	f.rec.queue = append(f.rec.queue, sharedEntry{id: w.id, mode: req.Mode, limit: req.Limit, ttl: req.TTL, owner: req.Owner})
	f.dirty = true
}

// openHeldShared opens key's lock for a change to owner's hold in mode,
// settled. It returns driver.ErrNotHeld if owner has no live hold in mode.
func (l *Locker) openHeldShared(ctx context.Context, key string, mode driver.SharedMode, owner string) (*sharedFile, int, instant, error) {
	f, err := l.openShared(ctx, key, mode.RW(), unix.LOCK_EX, false)
	if errors.Is(err, unix.ENOENT) {
		return nil, -1, instant{}, fmt.Errorf("file: %w", driver.ErrNotHeld)
	}
	if err != nil {
		return nil, -1, instant{}, err
	}
	at := now(l.boot)
	i := f.heldBy(owner, mode, at)
	if i < 0 {
		f.dirty = false
		_ = f.finish()
		return nil, -1, at, fmt.Errorf("file: %w", driver.ErrNotHeld)
	}
	return f, i, at, nil
}

// RefreshShared implements driver.SharedLocker: it resets the TTL of
// owner's live hold in mode, or returns driver.ErrNotHeld and changes
// nothing. An expired hold is never revived.
func (l *Locker) RefreshShared(ctx context.Context, key string, mode driver.SharedMode, owner string, ttl time.Duration) error {
	if err := checkShared(mode); err != nil {
		return err
	}
	if err := l.check(ctx, key, owner, ttl, true); err != nil {
		return err
	}
	f, i, at, err := l.openHeldShared(ctx, key, mode, owner)
	if err != nil {
		return err
	}
	f.rec.holders[i].expires = at.mono + int64(ttl)
	f.dirty = true
	err = f.settle(ctx, at)
	if ferr := f.finish(); err == nil {
		err = ferr
	}
	return err
}

// ReleaseShared implements driver.SharedLocker: it ends owner's live hold
// in mode and grants the waiters that now fit, or returns
// driver.ErrNotHeld and changes nothing.
func (l *Locker) ReleaseShared(ctx context.Context, key string, mode driver.SharedMode, owner string) error {
	if err := checkShared(mode); err != nil {
		return err
	}
	if err := l.check(ctx, key, owner, 0, false); err != nil {
		return err
	}
	f, i, at, err := l.openHeldShared(ctx, key, mode, owner)
	if err != nil {
		return err
	}
	f.rec.holders = slices.Delete(f.rec.holders, i, i+1)
	f.dirty = true
	err = f.settle(ctx, at)
	if ferr := f.finish(); err == nil {
		err = ferr
	}
	return err
}

// InspectShared implements driver.SharedLocker: the live holders of the
// semaphore (SharedPermit) or read-write lock (SharedRead, SharedWrite) on
// key, in token order, read under a shared flock. It changes nothing.
func (l *Locker) InspectShared(ctx context.Context, key string, mode driver.SharedMode) ([]driver.SharedInfo, error) {
	if err := checkShared(mode); err != nil {
		return nil, err
	}
	if err := l.check(ctx, key, "-", 0, false); err != nil {
		return nil, err
	}
	f, err := l.openShared(ctx, key, mode.RW(), unix.LOCK_SH, false)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(f.fd)
	at := now(l.boot)
	var out []driver.SharedInfo
	for i := range f.rec.holders {
		h := &f.rec.holders[i]
		if rem := f.rec.remaining(h, at); rem > 0 {
			out = append(out, driver.SharedInfo{
				Info: driver.Info{Owner: h.owner, Token: h.token, Remaining: rem},
				Mode: h.mode,
			})
		}
	}
	slices.SortFunc(out, func(a, b driver.SharedInfo) int { return cmp.Compare(a.Token, b.Token) })
	return out, nil
}
