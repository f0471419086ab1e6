package rueidis

import (
	"time"

	"github.com/go-locker/locker/internal/rediscore"
)

// Options configure a Locker built by New, NewRedlock or
// NewWithClientOption. Open reads the same settings from the URL's query
// parameters, named below. A nil *Options, like the zero value of each
// field, means the default. A field out of range makes those constructors
// fail with an error wrapping driver.ErrInvalid, before any I/O.
type Options struct {
	// Prefix starts every key the Locker writes (URL: prefix). Default
	// "locker". It must not contain '{' or '}', which would break the
	// Cluster hash tag.
	Prefix string
	// NodeTimeout bounds each Redlock call to one master, including the
	// read or subscription by which a Redlock Subscribe arms its wait on
	// each master (URL: node_timeout). Default 100ms; it must not be
	// negative.
	NodeTimeout time.Duration
	// DriftFactor is Redlock's clock drift allowance per unit of TTL (URL:
	// drift_factor): a grant is valid only if ttl - elapsed -
	// (ttl*DriftFactor + 2ms) > 0. Default 0.01; it must be in [0, 0.5).
	DriftFactor float64
	// MaxKeyLen is the longest key accepted, in bytes (URL: max_key_len);
	// a longer key is refused with driver.ErrInvalid. Default 4096; it
	// must not be negative.
	MaxKeyLen int
	// TokenRetention is how long a key's fencing-token counter outlives
	// the lock that last bumped it (URL: token_retention). Default 10m; it
	// must not be negative. Tokens are floored at the server's clock, so
	// they keep increasing once the counter is gone unless the server's
	// clock steps back by more than TokenRetention.
	TokenRetention time.Duration
	// Barging turns the fair queue off (URL: fair=false): a waiting
	// AcquireWait is woken with every other waiter when the key is
	// released, and the first to retry takes it. Default false: on a
	// single server, Cluster or Sentinel master, waiters queue on the
	// server and are granted in arrival order. Redlock always barges.
	Barging bool
	// QueueTTL is how long a queued waiter's entry lives unless the waiter
	// renews it, which it does every QueueTTL/2 while it waits (URL:
	// queue_ttl): a waiter that crashed or was cut off holds up the queue
	// for at most this long. Default 3s; at least 30ms.
	QueueTTL time.Duration
}

// core returns o as the shared Redis core takes it; nil is the zero
// Options (every default).
func (o *Options) core() rediscore.Options {
	if o == nil {
		return rediscore.Options{}
	}
	return rediscore.Options(*o)
}
