package redis

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/go-locker/locker/driver"
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

// config is a parsed redis:// or rediss:// URL.
type config struct {
	scheme         string
	addrs          []string // host:port, at least one
	username       string
	password       string
	db             int
	cluster        bool
	sentinelMaster string
	sentinelUser   string
	sentinelPass   string
	tls            bool
	insecureTLS    bool
	dialTimeout    time.Duration
	readTimeout    time.Duration
	writeTimeout   time.Duration
	poolSize       int
	clientName     string
	allowReplica   bool
	opts           rediscore.Options
}

// mode names the deployment the URL describes.
func (c *config) mode() string {
	switch {
	case c.cluster:
		return "cluster"
	case c.sentinelMaster != "":
		return "sentinel"
	case len(c.addrs) > 1:
		return "redlock"
	}
	return "single"
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("redis: "+format+": %w", append(args, driver.ErrInvalid)...)
}

// parseURL parses dsn; see the package documentation for the format. Errors
// wrap driver.ErrInvalid and never contain the password.
func parseURL(dsn string) (*config, error) {
	// net/url rejects host lists that mix IPv6 literals with other hosts:
	// take the host list out and parse the rest.
	dsn, hosts := splitHosts(dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL itself may hold a password
		}
		return nil, invalid("malformed URL (%v)", err)
	}
	c := &config{scheme: u.Scheme, dialTimeout: DefaultDialTimeout, readTimeout: DefaultReadTimeout, writeTimeout: DefaultWriteTimeout}
	switch u.Scheme {
	case "redis":
	case "rediss":
		c.tls = true
	default:
		return nil, invalid("URL scheme %q: want redis or rediss", u.Scheme)
	}
	if u.Opaque != "" {
		return nil, invalid("malformed URL: want %s://host:port", u.Scheme)
	}
	if u.User != nil {
		c.username = u.User.Username()
		c.password, _ = u.User.Password()
	}
	if hosts == "" {
		c.addrs = []string{"127.0.0.1:6379"}
	} else {
		for _, h := range strings.Split(hosts, ",") {
			if h == "" {
				return nil, invalid("empty host in host list %q", u.Host)
			}
			if _, _, err := net.SplitHostPort(h); err != nil {
				h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
			}
			host, port, err := net.SplitHostPort(h)
			if err != nil || host == "" {
				return nil, invalid("malformed host %q", h)
			}
			if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
				return nil, invalid("malformed port in host %q", h)
			}
			if slices.Contains(c.addrs, h) {
				return nil, invalid("host %q listed twice", h)
			}
			c.addrs = append(c.addrs, h)
		}
	}
	if p := strings.Trim(u.Path, "/"); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return nil, invalid("path %q: want a database number such as /0", u.Path)
		}
		c.db = n
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, invalid("malformed query (%v)", err)
	}
	if c.opts, err = rediscore.ParseOptions(q); err != nil {
		return nil, err
	}
	get := func(name string) (string, bool, error) {
		vs, ok := q[name]
		if !ok {
			return "", false, nil
		}
		delete(q, name)
		if len(vs) != 1 {
			return "", false, invalid("query parameter %q given %d times", name, len(vs))
		}
		return vs[0], true, nil
	}
	boolean := func(name string, dst *bool) error {
		s, ok, err := get(name)
		if err != nil || !ok {
			return err
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			return invalid("%s=%q: want true or false", name, s)
		}
		*dst = b
		return nil
	}
	str := func(name string, dst *string) error {
		s, ok, err := get(name)
		if err != nil || !ok {
			return err
		}
		if s == "" {
			return invalid("%s must not be empty", name)
		}
		*dst = s
		return nil
	}
	dur := func(name string, dst *time.Duration) error {
		s, ok, err := get(name)
		if err != nil || !ok {
			return err
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return invalid("%s=%q: want a positive Go duration such as 5s", name, s)
		}
		*dst = d
		return nil
	}
	for _, f := range []func() error{
		func() error { return boolean("cluster", &c.cluster) },
		func() error { return str("sentinel_master", &c.sentinelMaster) },
		func() error { return str("sentinel_username", &c.sentinelUser) },
		func() error { return str("sentinel_password", &c.sentinelPass) },
		func() error { return boolean("insecure_skip_verify", &c.insecureTLS) },
		func() error { return boolean("allow_replica", &c.allowReplica) },
		func() error { return str("client_name", &c.clientName) },
		func() error { return dur("dial_timeout", &c.dialTimeout) },
		func() error { return dur("read_timeout", &c.readTimeout) },
		func() error { return dur("write_timeout", &c.writeTimeout) },
		func() error {
			s, ok, err := get("pool_size")
			if err != nil || !ok {
				return err
			}
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				return invalid("pool_size=%q: want a positive integer", s)
			}
			c.poolSize = n
			return nil
		},
	} {
		if err := f(); err != nil {
			return nil, err
		}
	}
	if len(q) > 0 {
		names := make([]string, 0, len(q))
		for k := range q {
			names = append(names, k)
		}
		slices.Sort(names)
		return nil, invalid("unknown query parameter(s) %s", strings.Join(names, ", "))
	}
	switch {
	case c.cluster && c.sentinelMaster != "":
		return nil, invalid("cluster=true and sentinel_master are mutually exclusive")
	case (c.sentinelUser != "" || c.sentinelPass != "") && c.sentinelMaster == "":
		return nil, invalid("sentinel_username/sentinel_password need sentinel_master")
	case c.cluster && c.db != 0:
		return nil, invalid("a Redis Cluster has only database 0, not %d", c.db)
	case c.allowReplica && (c.cluster || c.sentinelMaster != ""):
		return nil, invalid("allow_replica applies to single-node and Redlock URLs only")
	case c.insecureTLS && !c.tls:
		return nil, invalid("insecure_skip_verify needs the rediss scheme")
	}
	return c, nil
}

// placeholderHost stands for the host list while net/url parses the rest.
const placeholderHost = "hosts.invalid"

// splitHosts replaces the host list of dsn (scheme://[userinfo@]hosts/...)
// with placeholderHost and returns it; dsn is unchanged if it has no
// authority.
func splitHosts(dsn string) (string, string) {
	i := strings.Index(dsn, "://")
	if i < 0 {
		return dsn, ""
	}
	rest := dsn[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	auth := rest[:end]
	at := strings.LastIndex(auth, "@")
	hosts := auth[at+1:]
	if hosts == "" {
		return dsn, ""
	}
	return dsn[:i+3] + auth[:at+1] + placeholderHost + rest[end:], hosts
}

// tlsConfig returns the TLS configuration, or nil without TLS. ServerName
// is left empty: crypto/tls then verifies each connection against the host
// it dials, which is right for every node of a Cluster or Sentinel set-up.
func (c *config) tlsConfig() *tls.Config {
	if !c.tls {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.insecureTLS} //nolint:gosec // opt-in
}

// nodeOptions returns go-redis options for one node at addr. Retries are
// off: a retried release could report ErrNotHeld for a lock it did free;
// package locker retries what is safe to retry.
func (c *config) nodeOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr: addr, Username: c.username, Password: c.password, DB: c.db,
		ClientName: c.clientName, TLSConfig: c.tlsConfig(),
		DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
		PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
	}
}

// client builds the go-redis client for a single, Cluster or Sentinel URL.
func (c *config) client() redis.UniversalClient {
	switch c.mode() {
	case "cluster":
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.addrs, Username: c.username, Password: c.password,
			ClientName: c.clientName, TLSConfig: c.tlsConfig(),
			DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
			PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	case "sentinel":
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.sentinelMaster, SentinelAddrs: c.addrs,
			SentinelUsername: c.sentinelUser, SentinelPassword: c.sentinelPass,
			Username: c.username, Password: c.password, DB: c.db,
			ClientName: c.clientName, TLSConfig: c.tlsConfig(),
			DialTimeout: c.dialTimeout, ReadTimeout: c.readTimeout, WriteTimeout: c.writeTimeout,
			PoolSize: c.poolSize, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true, DisableIdentity: true,
		})
	}
	return redis.NewClient(c.nodeOptions(c.addrs[0]))
}
