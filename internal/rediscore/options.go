package rediscore

import (
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
)

// Defaults of Options.
const (
	// DefaultNodeTimeout bounds each Redlock call to one node.
	DefaultNodeTimeout = 100 * time.Millisecond
	// DefaultDriftFactor is the Redlock clock drift allowance per unit of TTL.
	DefaultDriftFactor = 0.01
	// DefaultMaxKeyLen is the longest user key accepted, in bytes.
	DefaultMaxKeyLen = 4096
	// DefaultTokenRetention is how long a token counter outlives its lock.
	DefaultTokenRetention = 10 * time.Minute
	// DefaultQueueTTL is how long a queued waiter's entry lives without
	// being renewed.
	DefaultQueueTTL = 3 * time.Second
)

// Options are shared by both Redis drivers. The zero value of every field
// means its default.
type Options struct {
	// Prefix is the key prefix; default "locker". No braces.
	Prefix string
	// NodeTimeout bounds each Redlock call to one node (and the Redlock
	// subscription to one node); default 100ms.
	NodeTimeout time.Duration
	// DriftFactor is the Redlock drift allowance: a grant is valid only if
	// ttl - elapsed - (ttl*DriftFactor + 2ms) > 0. Default 0.01; zero means
	// the default.
	DriftFactor float64
	// MaxKeyLen is the longest key accepted, in bytes; default 4096 (package locker's own limit). Longer
	// keys are rejected with driver.ErrInvalid.
	MaxKeyLen int
	// TokenRetention (an addition to the core API) is how long a token
	// counter outlives the lock that last bumped it; default 10m. Tokens
	// are floored at the server's TIME in microseconds, so they keep
	// increasing once the counter is gone as long as the server clock does
	// not step back by more than TokenRetention.
	TokenRetention time.Duration
	// Barging (URL: fair=false) turns the fair queue off: a waiting Acquire
	// is woken with every other waiter when the key is released and takes it
	// if it is first, as with sync.Mutex. Default false: waiters queue on
	// the server and are granted in arrival order (see QueueAcquireScript).
	// Redlock always barges.
	Barging bool
	// QueueTTL (URL: queue_ttl) is how long a queued waiter's entry lives
	// unless the waiter renews it, which it does every QueueTTL/2 while it
	// waits; default 3s. A waiter that crashed or was cut off holds up the
	// queue for at most this long. At least 30ms.
	QueueTTL time.Duration
}

// WithDefaults returns o with every zero field set to its default.
func (o Options) WithDefaults() Options {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.NodeTimeout == 0 {
		o.NodeTimeout = DefaultNodeTimeout
	}
	if o.DriftFactor == 0 {
		o.DriftFactor = DefaultDriftFactor
	}
	if o.MaxKeyLen == 0 {
		o.MaxKeyLen = DefaultMaxKeyLen
	}
	if o.TokenRetention == 0 {
		o.TokenRetention = DefaultTokenRetention
	}
	if o.QueueTTL == 0 {
		o.QueueTTL = DefaultQueueTTL
	}
	return o
}

// Validate reports an error wrapping driver.ErrInvalid if a field is out of
// range: a prefix with braces, a negative duration, a drift factor outside
// [0, 0.5), a negative key length. Its errors start with "redis: ".
func (o Options) Validate() error { return o.validate("redis") }

// validate is Validate with errors starting with name.
func (o Options) validate(name prefix) error {
	switch {
	case strings.ContainsAny(o.Prefix, "{}"):
		return name.errorf("prefix %q must not contain '{' or '}' (they would break the Cluster hash tag): %w", o.Prefix, driver.ErrInvalid)
	case o.NodeTimeout < 0:
		return name.errorf("node_timeout %v must be positive: %w", o.NodeTimeout, driver.ErrInvalid)
	case o.DriftFactor < 0 || o.DriftFactor >= 0.5:
		return name.errorf("drift_factor %v must be in [0, 0.5): %w", o.DriftFactor, driver.ErrInvalid)
	case o.MaxKeyLen < 0:
		return name.errorf("max_key_len %d must be positive: %w", o.MaxKeyLen, driver.ErrInvalid)
	case o.TokenRetention < 0:
		return name.errorf("token_retention %v must be positive: %w", o.TokenRetention, driver.ErrInvalid)
	case o.QueueTTL < 0 || (o.QueueTTL > 0 && o.QueueTTL < MinQueueTTL):
		return name.errorf("queue_ttl %v must be at least %v: %w", o.QueueTTL, MinQueueTTL, driver.ErrInvalid)
	}
	return nil
}

// ParseOptions pulls the shared query parameters out of q, deleting the ones
// it consumed, so each driver can then reject whatever is left as unknown:
//
//	prefix=locker          key prefix (no braces)
//	node_timeout=100ms     Redlock per-node timeout (Go duration)
//	drift_factor=0.01      Redlock drift factor, in (0, 0.5)
//	max_key_len=4096       longest key in bytes
//	token_retention=10m    how long a token counter outlives its lock
//	fair=true              queue waiters on the server (false: barging)
//	queue_ttl=3s           how long a dead waiter's queue entry lives
//
// A parameter given twice or with a malformed value is an error wrapping
// driver.ErrInvalid. The result has defaults applied.
func ParseOptions(q url.Values) (Options, error) {
	var o Options
	r := &Query{Driver: "redis", Values: q}
	fair := true
	for _, f := range []func() error{
		func() error { return r.String("prefix", &o.Prefix) },
		func() error { return r.duration("node_timeout", &o.NodeTimeout, "100ms") },
		func() error { return r.duration("token_retention", &o.TokenRetention, "100ms") },
		func() error { return r.duration("queue_ttl", &o.QueueTTL, "100ms") },
		func() error { return r.Bool("fair", &fair) },
		func() error { return r.driftFactor(&o.DriftFactor) },
		func() error { return r.PositiveInt("max_key_len", &o.MaxKeyLen) },
	} {
		if err := f(); err != nil {
			return o, err
		}
	}
	o.Barging = !fair
	o = o.WithDefaults()
	if err := o.Validate(); err != nil {
		return o, err
	}
	return o, nil
}

// driftFactor sets *dst to drift_factor, if given: a number in (0, 0.5).
func (q *Query) driftFactor(dst *float64) error {
	s, ok, err := q.Get("drift_factor")
	if err != nil || !ok {
		return err
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f >= 0.5 {
		return Invalid(q.Driver, "drift_factor=%q: want a number in (0, 0.5)", s)
	}
	*dst = f
	return nil
}
