package locker

import (
	"fmt"
	"time"
)

// DefaultTTL is the TTL of a lock when WithTTL is not given.
const DefaultTTL = 30 * time.Second

// Option configures one Acquire, TryAcquire or Do call.
type Option func(*options)

type options struct {
	ttl       time.Duration
	autoRenew bool
	owner     string
	ownerSet  bool
}

// WithTTL sets how long the lock lives on the server without a renewal.
// The default is DefaultTTL (30s). A zero or negative ttl makes the call fail
// with ErrInvalid before any I/O. A ttl below the driver's minimum is rounded
// up to it, and to the driver's granularity (etcd: whole seconds, at least
// 2s); Lock.TTL reports the TTL in force.
func WithTTL(ttl time.Duration) Option {
	return func(o *options) { o.ttl = ttl }
}

// WithAutoRenew turns background renewal on or off. The default is on: the
// lock is refreshed every TTL/3 while held, and Lost is closed if renewal
// fails for longer than the lock can survive. With renewal off the lock
// lives for one TTL unless Refresh is called, and Lost is closed when that
// time (less the drift allowance) has passed.
func WithAutoRenew(on bool) Option {
	return func(o *options) { o.autoRenew = on }
}

// WithOwner sets the owner identity stored with the lock. The default is a
// random 128-bit value per acquisition, which is what mutual exclusion needs:
// two callers that share an owner string are the same holder to the backend
// (an Acquire by the owner succeeds and returns the same token). Use it only
// to hand a lock over between processes deliberately, or to make the holder
// recognisable in Inspect. An empty owner, or one longer than 256 bytes,
// fails with ErrInvalid.
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner; o.ownerSet = true }
}

// maxOwnerLen bounds owner strings so that every backend can store them.
const maxOwnerLen = 256

func buildOptions(opts []Option) (options, error) {
	o := options{ttl: DefaultTTL, autoRenew: true}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	if o.ttl <= 0 {
		return o, fmt.Errorf("%w: ttl must be positive, got %v", ErrInvalid, o.ttl)
	}
	if o.ownerSet && (o.owner == "" || len(o.owner) > maxOwnerLen) {
		return o, fmt.Errorf("%w: owner must be 1 to %d bytes", ErrInvalid, maxOwnerLen)
	}
	return o, nil
}
