package rueidis

import (
	"crypto/tls"
	"net"
	"strconv"
	"time"

	"github.com/go-locker/locker/internal/rediscore"
)

// Defaults of the URL's own query parameters.
const (
	// DefaultDialTimeout bounds connecting to a server, including the
	// handshake (HELLO, AUTH).
	DefaultDialTimeout = 5 * time.Second
)

// config is a parsed rueidis:// URL. It has no parameters beyond those
// shared with drivers/redis; tls=true is how it switches TLS on.
type config struct {
	rediscore.URL
}

// redlock reports whether the URL names several independent masters.
func (c *config) redlock() bool { return c.Mode() == "redlock" }

// parseURL parses dsn; see the package documentation for the format. Errors
// wrap driver.ErrInvalid and never contain the password.
func parseURL(dsn string) (*config, error) {
	u, err := rediscore.ParseURL(dsn, rediscore.URLSpec{
		Driver:      "rueidis",
		Schemes:     []string{Scheme},
		WantSchemes: strconv.Quote(Scheme),
		DialTimeout: DefaultDialTimeout,
		TLS: func(u *rediscore.URL, q *rediscore.Query) error {
			return q.Bool("tls", &u.TLS)
		},
		TLSHint: "tls=true",
	})
	if err != nil {
		return nil, err
	}
	return &config{URL: *u}, nil
}

// tlsConfig returns the TLS configuration for the server at addr, verified
// against its host name, or nil without tls=true.
func (c *config) tlsConfig(addr string) *tls.Config {
	host, _, _ := net.SplitHostPort(addr)
	return c.TLSConfig(host)
}
