package locker

import (
	"fmt"
	"sync"
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
	maxHold   time.Duration
	minHold   time.Duration
	attrs     *attrSets   // the telemetry attributes of the key; nil without telemetry
	hold      holdOps     // set by shared.go for a shared hold; nil for a mutex
	onLost    func(error) // called with the loss just before Lost closes, before the server is told (Election.Lead)
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
// recognisable in Inspect. The hand-over does not work on a backend whose
// locks belong to the connection that took them
// (driver.Capabilities.LockerBound: PostgreSQL advisory mode), where another
// process with the same owner is refused. An empty owner, or one longer
// than 256 bytes, fails with ErrInvalid.
func WithOwner(owner string) Option {
	return func(o *options) { o.owner = owner; o.ownerSet = true }
}

// WithMaxHold bounds how long the lock is held: d after the grant, renewal
// stops, Lost closes with CauseMaxHold (Do's context is cancelled), and an
// owner-checked release is sent, so the key is free at grant + d plus one
// round trip. If that release fails (the backend is unreachable then), the
// key expires on the server at most one TTL later. It is the bound on a
// stuck job: work that should have ended long ago cannot keep the lock by
// renewing it. Release and Refresh after the bound return an error
// matching ErrNotHeld and CauseMaxHold. The default, 0, is no bound. A
// negative d, or a d shorter than WithMinHold's, fails with ErrInvalid
// before any I/O.
//
// The bound counts from the grant on every way of waiting: an attempt that
// wins at once, one after waiting in this process (polling or woken by the
// driver), and a wait blocked in the server (driver.BlockingAcquirer), so
// time spent waiting is never taken out of d. The exact moment the server
// made the grant is not known to the client: it lies somewhere within the
// call that won the lock, or within the wait in the server. The bound
// counts from the end of that call, when its reply arrived (Lock.Granted),
// the latest moment the grant can have been: so the job is never stopped
// earlier than d after the grant, at the price of holding the key up to
// one round trip longer. (The safe deadline, by contrast, counts from the
// start of the call, the earliest moment the server can have started the
// TTL: each end is the one that errs on the safe side.)
func WithMaxHold(d time.Duration) Option {
	return func(o *options) { o.maxHold = d }
}

// WithMinHold keeps the key taken for at least d after the grant (counted,
// like WithMaxHold, from Lock.Granted, the latest moment the grant can
// have been), whatever the work does: a Release (or Do's release, or Locker.Close) earlier than
// that stops renewal and, instead of freeing the key, sets its TTL on the
// server to the time left until grant + d (rounded up like WithTTL, so up
// to the driver's TTL granularity later), owner-checked as Release is. The
// key is then held by nobody's work and expires on its own. Release returns
// nil, and ErrNotHeld if the lock had already been lost, as usual. A lock
// presumed lost (CauseDeadline) is treated the same way, rather than
// released. A backend whose locks end with the client's session
// (PostgreSQL advisory locks) frees them early if the Locker is closed
// before grant + d. It is for fleets of cron jobs: a run that finished in 2s on one
// host is not started again by a host whose clock is a few seconds behind.
// It does not keep alive a lock that is lost, nor one left unrenewed (see
// WithAutoRenew). The default, 0, frees the key at Release. A negative d,
// or one longer than a non-zero WithMaxHold, fails with ErrInvalid before
// any I/O.
func WithMinHold(d time.Duration) Option {
	return func(o *options) { o.minHold = d }
}

// maxOwnerLen bounds owner strings so that every backend can store them.
const maxOwnerLen = 256

// optionsPool holds the options that buildOptions applies Options to: an
// Option takes a pointer, so options of its own would escape to the heap
// on every call. No Option keeps the pointer.
var optionsPool = sync.Pool{New: func() any { return new(options) }}

func buildOptions(opts []Option) (options, error) {
	p := optionsPool.Get().(*options)
	*p = options{ttl: DefaultTTL, autoRenew: true}
	for _, opt := range opts {
		if opt != nil {
			opt(p)
		}
	}
	o := *p
	*p = options{}
	optionsPool.Put(p)
	if o.ttl <= 0 {
		return o, fmt.Errorf("%w: ttl must be positive, got %v", ErrInvalid, o.ttl)
	}
	if o.ownerSet && (o.owner == "" || len(o.owner) > maxOwnerLen) {
		return o, fmt.Errorf("%w: owner must be 1 to %d bytes", ErrInvalid, maxOwnerLen)
	}
	if o.maxHold < 0 {
		return o, fmt.Errorf("%w: max hold must not be negative, got %v", ErrInvalid, o.maxHold)
	}
	if o.minHold < 0 {
		return o, fmt.Errorf("%w: min hold must not be negative, got %v", ErrInvalid, o.minHold)
	}
	if o.maxHold > 0 && o.minHold > o.maxHold {
		return o, fmt.Errorf("%w: min hold %v is longer than max hold %v", ErrInvalid, o.minHold, o.maxHold)
	}
	return o, nil
}
