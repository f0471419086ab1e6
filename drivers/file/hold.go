package file

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker/driver"
	"golang.org/x/sys/unix"
)

// holdCheckTimeout bounds one re-read of a watched lock file. A flock held
// longer (a stopped process) skips that check; the next event re-checks.
const holdCheckTimeout = time.Second

var _ driver.HoldWatcher = (*Locker)(nil)

// WatchHold implements driver.HoldWatcher: it watches key's lock file with
// inotify, and on every change to it (or a directory event that may hide
// one) re-reads the record under its flock. lost is called, once, when the
// file is gone or unreadable, or its record names another owner or another
// grant: then another process removed the lease or was granted the key. The
// owner's own refresh or release, and a lease that merely ran out its TTL,
// are not reported. It
// returns an error (the grant is then not watched) when inotify cannot be
// had, driver.ErrInvalid for an empty or oversized key or owner, and
// driver.ErrClosed after Close.
func (l *Locker) WatchHold(key, owner string, token uint64, lost func(error)) (stop func(), err error) {
	if err := l.check(context.Background(), key, owner, 0, false); err != nil {
		return nil, err
	}
	s, err := l.newSubscription(key)
	if err != nil {
		return nil, err
	}
	if s.w == nil {
		s.stop(false)
		return nil, fmt.Errorf("file: %w: inotify is not available", driver.ErrUnavailable)
	}
	go s.watchHold(owner, token, lost)
	return func() { s.stop(false) }, nil
}

// watchHold checks the grant now and after every event on the lock file
// until it is found lost, when it calls lost (once, and only if the watch
// has not stopped), or the watch stops.
func (s *subscription) watchHold(owner string, token uint64, lost func(error)) {
	c := &s.hold
	c.done = s.done
	for {
		if err := s.checkHold(c, owner, token); err != nil {
			select {
			case <-s.done:
			default:
				lost(err)
			}
			return
		}
		select {
		case <-s.done:
			return
		case <-s.poke:
		case <-s.wake:
		}
	}
}

// checkCtx bounds one hold check's wait for the lock file's flock: it is
// done when the watch stops, and past its deadline (holdCheckTimeout after
// the check began) its Err is context.DeadlineExceeded, which flockFile
// checks between its attempts (at most 2ms apart). Unlike a context from
// package context, its Done is not closed at the deadline: flockFile, its
// only user, polls Err. One per watch (in its subscription), reused by
// every check, so that a check allocates no context, timer or goroutine.
type checkCtx struct {
	done     <-chan struct{}
	deadline time.Time
}

func (c *checkCtx) Deadline() (time.Time, bool) { return c.deadline, true }
func (c *checkCtx) Done() <-chan struct{}       { return c.done }
func (c *checkCtx) Value(any) any               { return nil }

func (c *checkCtx) Err() error {
	select {
	case <-c.done:
		return context.Canceled
	default:
	}
	if !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// checkHold returns an error wrapping driver.ErrNotHeld if the lock file
// shows that owner's grant with token is gone, nil if it is still there or
// the file could not be checked now.
func (s *subscription) checkHold(ctx *checkCtx, owner string, token uint64) error {
	ctx.deadline = time.Now().Add(holdCheckTimeout)
	fd, err := flockFile(ctx, s.path, unix.LOCK_SH, false, s.l.perm)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("file: %w: lock file %s removed", driver.ErrNotHeld, s.path)
	}
	if err != nil {
		return nil // not checkable now (flock held, I/O error): renewal still applies
	}
	defer unix.Close(fd)
	r, ok, err := readLease(fd)
	switch {
	case err != nil:
		return nil
	case !ok:
		return fmt.Errorf("file: %w: lock file %s holds no lease", driver.ErrNotHeld, s.path)
	case r.key != s.key || r.token != token:
		return fmt.Errorf("file: %w: key granted again (token %d)", driver.ErrNotHeld, r.token)
	case r.owner != owner && r.owner != "": // "": released by owner itself
		return fmt.Errorf("file: %w: lease rewritten by another owner", driver.ErrNotHeld)
	}
	return nil
}
