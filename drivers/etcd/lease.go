package etcd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Leases. Every lock has a lease of its own, so that a lock not refreshed
// expires after its own TTL whatever the other locks of the Locker do. To
// keep the uncontended path at one round trip, a lease freed by Release (or
// by an Acquire that found the key held) is kept as a spare and reused by a
// later Acquire with the same TTL: the Acquire sends a keepalive for it in
// parallel with its transaction, so the reused lease is reset to a full TTL
// from a moment after the Acquire started. A spare nobody reuses simply
// expires on the server; Close revokes the rest.

// maxSpare bounds the spare leases kept per TTL.
const maxSpare = 8

// lease is a lease this Locker granted.
type lease struct {
	id   clientv3.LeaseID
	secs int64
	// expires is a conservative local estimate of the server-side expiry:
	// the send time of the last successful grant or keepalive plus secs.
	expires time.Time
}

// usable reports whether a spare lease is worth reusing: it should survive
// until the transaction that reuses it reaches the server.
func (le lease) usable(now time.Time) bool {
	return le.expires.Sub(now) > time.Duration(le.secs)*time.Second/4
}

func isLeaseNotFound(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrGRPCLeaseNotFound)
}

// takeSpare returns a usable spare lease of secs seconds, if there is one.
func (l *Locker) takeSpare(secs int64) (lease, bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	ls := l.spare[secs]
	for len(ls) > 0 {
		le := ls[len(ls)-1]
		ls = ls[:len(ls)-1]
		if le.usable(now) {
			l.spare[secs] = ls
			return le, true
		}
	}
	delete(l.spare, secs)
	return lease{}, false
}

// putSpare keeps le for reuse, or revokes it in the background when there
// are enough spares or the Locker is closed. le must have no key attached.
func (l *Locker) putSpare(le lease) {
	if le.id == clientv3.NoLease {
		return
	}
	l.mu.Lock()
	if !l.closed.Load() && len(l.spare[le.secs]) < maxSpare && le.usable(time.Now()) {
		l.spare[le.secs] = append(l.spare[le.secs], le)
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	l.revokeBG(le.id)
}

// revokeBG revokes id in the background (Close waits for it).
func (l *Locker) revokeBG(id clientv3.LeaseID) {
	if id == clientv3.NoLease {
		return
	}
	l.goBG(func(ctx context.Context) { _, _ = l.c.Revoke(ctx, id) })
}

// revokeNow revokes id before returning, within revokeNowTimeout (then in
// the background): used when a request was cut short and may have attached
// a key to the lease, so that nothing is left held when the call returns.
func (l *Locker) revokeNow(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), revokeNowTimeout)
	defer cancel()
	if _, err := l.c.Revoke(ctx, id); err != nil && !isLeaseNotFound(err) {
		l.revokeBG(id)
	}
}

// revokeCutGrant revokes the lease of a grant cut short by its context. The
// server may still be handling that grant, and apply it after a first
// revoke (which then finds no lease): revoke again after each of
// cutGrantDelays, so that a grant a loaded server applies late is still
// revoked. Close ends the later revokes (it revokes the spares itself).
func (l *Locker) revokeCutGrant(id clientv3.LeaseID) {
	l.revokeNow(id)
	l.goBG(func(ctx context.Context) {
		for _, d := range cutGrantDelays {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return
			case <-l.base.Done():
				t.Stop()
				return
			}
			_, _ = l.c.Revoke(ctx, id)
		}
	})
}

// cutGrantDelays are the pauses before each later revoke of a cut-short
// grant: 0.5s and 1.5s after it, within bgTimeout.
var cutGrantDelays = []time.Duration{500 * time.Millisecond, time.Second}

// revokeNowTimeout bounds the synchronous part of revokeNow.
const revokeNowTimeout = 250 * time.Millisecond

// grant creates a lease of secs seconds. If the server grants a longer TTL
// (its minimum lease TTL is higher than secs), the lease is revoked and the
// error wraps driver.ErrInvalid: a lock must not outlive its TTL.
//
// The lease ID is chosen here, at random, rather than by the server, so that
// a grant cut short by ctx (which the server may still have applied) can be
// revoked: a cancelled Acquire leaves no lease behind.
func (l *Locker) grant(ctx context.Context, secs int64) (lease, error) {
	var lastErr error
	for range 3 {
		id := rand.Int64N(math.MaxInt64) + 1
		sent := time.Now()
		r, err := pb.NewLeaseClient(l.c.ActiveConnection()).LeaseGrant(ctx, &pb.LeaseGrantRequest{TTL: secs, ID: id})
		if err == nil && r.Error != "" {
			err = errors.New(r.Error)
		}
		if err != nil {
			err = rpctypes.Error(err)
			if errors.Is(err, rpctypes.ErrLeaseExist) {
				lastErr = err
				continue // a 1-in-2⁶³ collision: pick another ID
			}
			if ctx.Err() != nil {
				l.revokeCutGrant(clientv3.LeaseID(id))
			}
			return lease{}, err
		}
		le := lease{id: clientv3.LeaseID(r.ID), secs: secs, expires: sent.Add(time.Duration(secs) * time.Second)}
		if r.TTL != secs {
			l.revokeBG(le.id)
			return lease{}, invalid("the server granted a %ds lease for %ds: its minimum lease TTL is above the requested TTL (raise min_ttl)", r.TTL, secs)
		}
		return le, nil
	}
	return lease{}, lastErr
}

// keepAlive renews le once. It returns the lease's granted TTL in seconds;
// an expired lease is an error for which isLeaseNotFound is true.
func (l *Locker) keepAlive(ctx context.Context, le *lease) (int64, error) {
	sent := time.Now()
	ttl, err := l.renew(ctx, le.id)
	if errors.Is(err, errStreamEnded) && ctx.Err() == nil {
		// The stream broke (reconnect, leader change): a renewal is
		// idempotent, so send it again on a new stream.
		sent = time.Now()
		ttl, err = l.renew(ctx, le.id)
	}
	if err != nil {
		return 0, err
	}
	if ttl == le.secs {
		le.expires = sent.Add(time.Duration(ttl) * time.Second)
	}
	return ttl, nil
}

// freshLease returns a lease of secs seconds whose TTL runs from a moment
// after now: a spare renewed by a keepalive sent in the background (wait
// for it with the returned function before relying on the lease), or a new
// grant.
func (l *Locker) freshLease(ctx context.Context, secs int64) (le *lease, wait func() error, err error) {
	if sp, ok := l.takeSpare(secs); ok {
		le = &sp
		sent := time.Now()
		p := l.sendRenew(le.id)
		return le, func() error {
			ttl, err := awaitRenew(ctx, p)
			if errors.Is(err, errStreamEnded) && ctx.Err() == nil {
				sent = time.Now()
				ttl, err = l.renew(ctx, le.id)
			}
			switch {
			case err != nil:
				return err
			case ttl != secs:
				return fmt.Errorf("spare lease has TTL %ds, want %ds", ttl, secs)
			}
			le.expires = sent.Add(time.Duration(ttl) * time.Second)
			return nil
		}, nil
	}
	g, err := l.grant(ctx, secs)
	if err != nil {
		return nil, nil, err
	}
	return &g, func() error { return nil }, nil
}
