package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-locker/locker/driver"
)

// check refuses, before any I/O, a call on a closed Locker, an empty key
// and (for the calls that take one, ttl ≠ noTTL) a non-positive ttl.
func (l *tcpLocker) check(key string, ttl time.Duration) error {
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	switch {
	case closed:
		return fmt.Errorf("tcpref: %w", driver.ErrClosed)
	case key == "":
		return fmt.Errorf("tcpref: empty key: %w", driver.ErrInvalid)
	case ttl <= 0 && ttl != noTTL:
		return fmt.Errorf("tcpref: ttl %v: %w", ttl, driver.ErrInvalid)
	}
	return nil
}

// noTTL tells check that the call takes no ttl.
const noTTL = -1

// answer turns a reply other than OK into the driver's error.
func answer(op, st string, vals [][]byte) error {
	switch st {
	case "OK":
		return nil
	case "NOTHELD":
		return fmt.Errorf("tcpref: %s: %w", op, driver.ErrNotHeld)
	case "HELD":
		rem, _ := num(vals[0])
		return fmt.Errorf("tcpref: %s: %w", op, &driver.HeldError{Remaining: time.Duration(rem)})
	case "INVALID":
		return fmt.Errorf("tcpref: %s: %s: %w", op, vals[0], driver.ErrInvalid)
	}
	return fmt.Errorf("tcpref: %s: server replied %s %q", op, st, vals)
}

// Acquire implements driver.Locker.
func (l *tcpLocker) Acquire(ctx context.Context, key, owner string, ttl time.Duration) (uint64, error) {
	if err := l.check(key, ttl); err != nil {
		return 0, err
	}
	st, vals, err := l.call(ctx, "ACQ", []byte(key), []byte(owner), dur(ttl))
	if err != nil {
		if l.is("tcp-lost-reply-not-acquired") && ctx.Err() != nil {
			return 0, fmt.Errorf("tcpref: no reply: %w", driver.ErrNotAcquired) // a lost reply taken for a refusal
		}
		return 0, err
	}
	if err := answer("acquire", st, vals); err != nil {
		return 0, err
	}
	if l.is("tcp-reset-reasserts") {
		l.mu.Lock()
		l.believed[key] = tcpBelief{owner, ttl}
		l.mu.Unlock()
	}
	tok, _ := num(vals[0])
	return tok, nil
}

// Refresh implements driver.Locker.
func (l *tcpLocker) Refresh(ctx context.Context, key, owner string, ttl time.Duration) error {
	if err := l.check(key, ttl); err != nil {
		return err
	}
	st, vals, err := l.call(ctx, "REF", []byte(key), []byte(owner), dur(ttl))
	if err != nil {
		if l.is("tcp-refresh-ok-on-timeout") && errors.Is(err, context.DeadlineExceeded) {
			return nil // a timed-out call taken for a success
		}
		return err
	}
	return answer("refresh", st, vals)
}

// Release implements driver.Locker.
func (l *tcpLocker) Release(ctx context.Context, key, owner string) error {
	if err := l.check(key, noTTL); err != nil {
		return err
	}
	st, vals, err := l.call(ctx, "REL", []byte(key), []byte(owner))
	if err != nil {
		return err
	}
	return answer("release", st, vals)
}

// Inspect implements driver.Inspector.
func (l *tcpLocker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if err := l.check(key, noTTL); err != nil {
		return driver.Info{}, err
	}
	st, vals, err := l.call(ctx, "INS", []byte(key))
	if err == nil {
		err = answer("inspect", st, vals)
	}
	if err != nil {
		return driver.Info{}, err
	}
	if len(vals) != 3 {
		return driver.Info{}, errors.New("tcpref: inspect: malformed reply of " + strconv.Itoa(len(vals)) + " values")
	}
	tok, _ := num(vals[1])
	rem, _ := num(vals[2])
	return driver.Info{Owner: string(vals[0]), Token: tok, Remaining: time.Duration(rem)}, nil
}

// Ping implements driver.Pinger.
func (l *tcpLocker) Ping(ctx context.Context) error {
	if err := l.check("-", noTTL); err != nil { // Ping takes no key: only ErrClosed applies
		return err
	}
	st, vals, err := l.call(ctx, "PING")
	if err != nil {
		return err
	}
	return answer("ping", st, vals)
}

// Capabilities implements driver.Capable: any positive TTL is kept to the
// nanosecond, and tokens survive a restart that loses the leases (the
// server keeps its token counter apart from them).
func (l *tcpLocker) Capabilities() driver.Capabilities {
	return driver.Capabilities{DurableTokens: true}
}

// Close implements driver.Locker: it ends the session; locks on the server
// are left to expire.
func (l *tcpLocker) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.quit)
	s := l.sess
	l.sess = nil
	l.mu.Unlock()
	if s != nil {
		s.fail(fmt.Errorf("tcpref: %w", driver.ErrClosed))
	}
	return nil
}

var (
	_ driver.Locker    = (*tcpLocker)(nil)
	_ driver.Inspector = (*tcpLocker)(nil)
	_ driver.Pinger    = (*tcpLocker)(nil)
	_ driver.Capable   = (*tcpLocker)(nil)
)
