package postgres

import (
	"errors"
	"fmt"
)

// SlotsError is the server's "too many clients already" (SQLSTATE 53300:
// no free connection slot under max_connections), with what to do about it
// in the Locker's mode. Errors carrying it also wrap driver.ErrUnavailable
// and the server's *pgconn.PgError.
type SlotsError struct {
	// Mode is ModeAdvisory or ModeLease; empty when not known.
	Mode string
	// PoolMaxConns is the Locker's pool_max_conns.
	PoolMaxConns int32
	// Err is the server's error.
	Err error
}

// Error is the server's error, with what the Locker's mode makes of it.
func (e *SlotsError) Error() string {
	if h := e.hint(); h != "" {
		return fmt.Sprintf("the server has no free connection slot (max_connections): %v; %s", e.Err, h)
	}
	return fmt.Sprintf("the server has no free connection slot (max_connections): %v", e.Err)
}

// hint names the cause for the mode: in advisory mode every held lock and
// every waiter blocked in the server pins a connection; in lease mode the
// Locker's own use is bounded by its pool, so the server's slots were
// taken by other clients or too many Lockers.
func (e *SlotsError) hint() string {
	switch e.Mode {
	case ModeAdvisory:
		return fmt.Sprintf("in advisory mode every held lock and every waiter blocked in the server pins one connection (pool_max_conns %d): raise max_connections, hold fewer locks at once, or use mode=lease",
			e.PoolMaxConns)
	case ModeLease:
		return fmt.Sprintf("in lease mode a Locker uses at most pool_max_conns (%d) pooled connections, one for renewals and one for release notifications, however many locks it holds; other clients or Lockers hold the rest: lower pool_max_conns or raise max_connections",
			e.PoolMaxConns)
	}
	return ""
}

func (e *SlotsError) Unwrap() error { return e.Err }

// withMode fills in the mode and pool size of a *SlotsError inside err,
// made without them, and appends what the mode makes of it to err's
// message (the messages of the errors wrapping it are already made).
func withMode(err error, mode string, poolMax int32) error {
	var se *SlotsError
	if errors.As(err, &se) && se.Mode == "" {
		se.Mode, se.PoolMaxConns = mode, poolMax
		return fmt.Errorf("%w; %s", err, se.hint())
	}
	return err
}
