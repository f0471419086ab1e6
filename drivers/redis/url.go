package redis

import (
	"context"
	"crypto/tls"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/internal/rediscore"
)

// Defaults of the URL's own query parameters.
const (
	// DefaultDialTimeout bounds connecting to a server, handshake included.
	DefaultDialTimeout = 5 * time.Second
	// DefaultReadTimeout bounds reading one reply when the call's context
	// has no earlier deadline.
	DefaultReadTimeout = 3 * time.Second
	// DefaultWriteTimeout bounds writing one command when the call's
	// context has no earlier deadline.
	DefaultWriteTimeout = 3 * time.Second
)

// config is a parsed redis:// or rediss:// URL: the part shared with
// drivers/rueidis, plus go-redis's own parameters.
type config struct {
	rediscore.URL
	readTimeout  time.Duration
	writeTimeout time.Duration
	poolSize     int
}

// parseURL parses dsn; see the package documentation for the format. Errors
// wrap driver.ErrInvalid and never contain the password.
func parseURL(dsn string) (*config, error) {
	c := &config{readTimeout: DefaultReadTimeout, writeTimeout: DefaultWriteTimeout}
	u, err := rediscore.ParseURL(dsn, rediscore.URLSpec{
		Driver:      "redis",
		Schemes:     []string{"redis", "rediss"},
		WantSchemes: "redis or rediss",
		DialTimeout: DefaultDialTimeout,
		TLS: func(u *rediscore.URL, _ *rediscore.Query) error {
			u.TLS = u.Scheme == "rediss"
			return nil
		},
		TLSHint: "the rediss scheme",
		Params: func(q *rediscore.Query) error {
			if err := q.Duration("read_timeout", &c.readTimeout); err != nil {
				return err
			}
			if err := q.Duration("write_timeout", &c.writeTimeout); err != nil {
				return err
			}
			return q.PositiveInt("pool_size", &c.poolSize)
		},
	})
	if err != nil {
		return nil, err
	}
	c.URL = *u
	return c, nil
}

// tlsConfig returns the TLS configuration, or nil without TLS. ServerName
// is left empty: crypto/tls then verifies each connection against the host
// it dials, which is right for every node of a Cluster or Sentinel set-up.
func (c *config) tlsConfig() *tls.Config { return c.TLSConfig("") }

// nodeOptions returns go-redis options for one node at addr. Retries are
// off: a retried release could report ErrNotHeld for a lock it did free;
// package locker retries what is safe to retry.
func (c *config) nodeOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr: addr, Username: c.Username, Password: c.Password, DB: c.DB,
		ClientName: c.ClientName, TLSConfig: c.tlsConfig(),
		DialTimeout: c.DialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
		PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
	}
}

// client builds the go-redis client for a single, Cluster or Sentinel URL.
func (c *config) client() redis.UniversalClient {
	switch c.Mode() {
	case "cluster":
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.Addrs, Username: c.Username, Password: c.Password,
			ClientName: c.ClientName, TLSConfig: c.tlsConfig(),
			DialTimeout: c.DialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
			PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	case "sentinel":
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.SentinelMaster, SentinelAddrs: c.Addrs,
			SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword,
			Username: c.Username, Password: c.Password, DB: c.DB,
			ClientName: c.ClientName, TLSConfig: c.tlsConfig(),
			DialTimeout: c.DialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
			PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	}
	return redis.NewClient(c.nodeOptions(c.Addrs[0]))
}

// watchClient builds a one-connection client for hold watching, on the
// single server or the Sentinel master, calling onConnect on each new
// connection; resp2 selects RESP2 (the invalidation subscriber). Its
// pipelines run on that connection too: go-redis would otherwise give them
// a pool of their own, whose every connection would track apart.
func (c *config) watchClient(onConnect func(context.Context, *redis.Conn) error, resp2 bool) *redis.Client {
	proto := 3
	if resp2 {
		proto = 2
	}
	if c.Mode() == "sentinel" {
		// go-redis runs OnConnect on its connections to the sentinels
		// too; only the master's connections get the hook.
		hook := onConnect
		onConnect = func(ctx context.Context, cn *redis.Conn) error {
			v, err := cn.Do(ctx, "ROLE").Slice()
			if err != nil {
				return err
			}
			if len(v) > 0 && v[0] == "sentinel" {
				return nil
			}
			return hook(ctx, cn)
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.SentinelMaster, SentinelAddrs: c.Addrs,
			SentinelUsername: c.SentinelUsername, SentinelPassword: c.SentinelPassword,
			Username: c.Username, Password: c.Password, DB: c.DB,
			ClientName: c.ClientName, TLSConfig: c.tlsConfig(), Protocol: proto,
			DialTimeout: c.DialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
			PoolSize: 1, PipelinePoolSize: -1, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
			OnConnect: onConnect,
		})
	}
	return c.watchClientAt(c.Addrs[0])(onConnect, resp2)
}

// watchClientAt returns watchClient for the server at addr (a Cluster
// master).
func (c *config) watchClientAt(addr string) func(func(context.Context, *redis.Conn) error, bool) *redis.Client {
	return func(onConnect func(context.Context, *redis.Conn) error, resp2 bool) *redis.Client {
		o := c.nodeOptions(addr)
		o.PoolSize, o.Protocol, o.OnConnect = 1, 3, onConnect
		o.PipelinePoolSize = -1 // pipelines on the one connection too (no pipeline pool)
		if resp2 {
			o.Protocol = 2
		}
		return redis.NewClient(o)
	}
}
