package etcd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/go-locker/locker/driver"
)

// Push-back. etcd refuses a write with "etcdserver: too many requests"
// when its apply loop is more than 5,000 entries behind its log: the
// request was never proposed, so nothing happened and it is safe to send
// again. Acquire and Release then back off and retry (jittered, doubling
// from pushbackMin to pushbackMax) for at most the request timeout and
// while ctx lasts; renewals of locks already held (lease keepalives and
// batched reads, which are not proposals) are never refused this way, so
// under load new acquires wait and held locks keep being renewed.

// Priority. Renewals are what keep held locks alive; a flood of acquires
// or releases fills the cluster's apply queue, and every renewal's
// linearizable owner check then waits behind it. So each Locker lets at
// most maxWrites Acquire attempts, and as many Release attempts, be in
// flight at once (releases never wait behind acquires); the others wait
// for a turn (bounded by their context), while renewals are never held
// back. Waits for a lock (watches) take no turn.
const maxWrites = 16

const (
	pushbackMin = 10 * time.Millisecond
	pushbackMax = 500 * time.Millisecond
)

// ErrPushback is wrapped, with driver.ErrUnavailable, by the error of an
// Acquire or Release the cluster refused with "too many requests" on every
// attempt for the request timeout.
var ErrPushback = errors.New("the cluster refused every attempt with \"too many requests\" (its apply loop is behind)")

// tooManyRequests reports whether err is etcd's push-back.
func tooManyRequests(err error) bool {
	return errors.Is(rpctypes.Error(err), rpctypes.ErrTooManyRequests) || errors.Is(err, rpctypes.ErrGRPCRequestTooManyRequests)
}

// withPushback runs f, each attempt in a turn of its own (see maxWrites)
// bounded by the request timeout, again
// after each push-back, waiting in between, until f ends otherwise, ctx
// ends, or the push-back has lasted the request timeout (then the error
// wraps driver.ErrUnavailable and ErrPushback).
func (l *Locker) withPushback(ctx context.Context, turns chan struct{}, f func(ctx context.Context) error) error {
	start := time.Now()
	delay := pushbackMin
	for {
		select {
		case turns <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		cctx, cancel := l.opCtx(ctx)
		err := f(cctx)
		cancel()
		<-turns
		if err == nil || !tooManyRequests(err) {
			return err
		}
		d := delay/2 + rand.N(delay/2+1)
		if waited := time.Since(start); waited+d > l.requestTimeout {
			return fmt.Errorf("%w: %w for %v: %w", driver.ErrUnavailable, ErrPushback, waited.Round(time.Millisecond), err)
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (while the cluster pushed back: %w)", ctx.Err(), err)
		}
		delay = min(2*delay, pushbackMax)
	}
}
