package redis

import (
	"testing"

	"github.com/go-locker/locker/internal/redistest/drivertest"
)

var urls = drivertest.URLs{
	Of:       urlOf,
	Password: func(pw, addr string) string { return "redis://:" + pw + "@" + addr },
	TLS:      func(addr string) string { return "rediss://" + addr },
	FastFail: "dial_timeout=1s&read_timeout=1s&write_timeout=1s",
}

// A server whose maxmemory-policy can evict lock keys is refused at Open
// in every mode unless allow_eviction=true.
func TestOpenRefusesEvictingServer(t *testing.T) { drivertest.Eviction(t, urls) }

// Every mode with its servers killed: ErrUnavailable at Open and
// TryAcquire; a held key stays ErrNotAcquired.
func TestErrUnavailable(t *testing.T) { drivertest.Unavailable(t, urls) }
