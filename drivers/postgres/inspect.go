package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5"
)

// Inspect reports the current holder of key from the server's view:
// pg_locks joined with pg_stat_activity, where a holder's session publishes
// "lk/<token>/<ttl>/<owner tag>" as its application_name. Remaining is the
// TTL minus the time the holder's session has been idle (its
// idle_session_timeout clock). The owner is exact for a lock this Locker
// holds; for others it is the owner tag (see the package documentation: long
// or non-ASCII owners show as "#" and a hash prefix). A key held by a session
// that is not a locker holder (another program using the same advisory key)
// reports an empty Owner, token 0 and Remaining 0. Remaining is also 0 when
// the server hides the holder's activity from this role.
//
// Errors: driver.ErrNotHeld if no session holds key; driver.ErrInvalid for
// an empty key; driver.ErrClosed; ctx.Err().
func (l *advisoryLocker) Inspect(ctx context.Context, key string) (driver.Info, error) {
	if key == "" {
		return driver.Info{}, fmt.Errorf("postgres: empty key: %w", driver.ErrInvalid)
	}
	ctx, done, err := l.begin(ctx)
	if err != nil {
		return driver.Info{}, err
	}
	defer done()
	adv := AdvisoryKey(l.ns, key)
	var app, state *string
	var idle *int64
	err = l.pool.QueryRow(ctx, l.sql.inspect, uint32(uint64(adv)>>32), uint32(uint64(adv))).Scan(&app, &state, &idle)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Info{}, notHeld("inspect", key)
	}
	if err != nil {
		return driver.Info{}, l.fail(ctx, "inspect", unavailable(err))
	}
	var info driver.Info
	if app == nil {
		return info, nil
	}
	token, ttlMS, tag, ok := parseAppName(*app)
	if !ok {
		return info, nil
	}
	info.Owner, info.Token = tag, token
	if state != nil && idle != nil {
		rem := time.Duration(ttlMS) * time.Millisecond
		if *state == "idle" {
			rem -= time.Duration(*idle) * time.Millisecond
		}
		info.Remaining = max(rem, time.Millisecond)
	}
	if s := l.peekSlot(mutexID(key)); s != nil {
		s.mu.Lock()
		if s.h != nil && s.h.token == token {
			info.Owner = s.h.owner
		}
		s.mu.Unlock()
		l.putSlot(mutexID(key), s)
	}
	return info, nil
}
