package rueidis

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

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

// Defaults of the URL's own query parameters.
const (
	// DefaultDialTimeout bounds connecting to a server, including the
	// handshake (HELLO, AUTH).
	DefaultDialTimeout = 5 * time.Second
)

// config is a parsed rueidis:// URL.
type config struct {
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
	clientName     string
	allowReplica   bool
	opts           rediscore.Options
}

// redlock reports whether the URL names several independent masters.
func (c *config) redlock() bool {
	return len(c.addrs) > 1 && !c.cluster && c.sentinelMaster == ""
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("rueidis: "+format+": %w", append(args, driver.ErrInvalid)...)
}

// parseURL parses dsn; see the package documentation for the format. Errors
// wrap driver.ErrInvalid and never contain the password.
func parseURL(dsn string) (*config, error) {
	// The host list is split by hand: url.Parse accepts only one host, so
	// "h1,h2:7001" or a list with IPv6 literals would not parse.
	hostList, rest, err := splitHosts(dsn)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(rest)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL itself may hold a password
		}
		return nil, invalid("malformed URL (%v)", err)
	}
	if u.Scheme != Scheme {
		return nil, invalid("URL scheme %q: want %q", u.Scheme, Scheme)
	}
	if u.Opaque != "" {
		return nil, invalid("malformed URL: want %s://host:port", Scheme)
	}
	c := &config{dialTimeout: DefaultDialTimeout}
	if u.User != nil {
		c.username = u.User.Username()
		c.password, _ = u.User.Password()
	}
	if hostList == "" {
		c.addrs = []string{"127.0.0.1:6379"}
	} else {
		for _, h := range strings.Split(hostList, ",") {
			if h == "" {
				return nil, invalid("empty host in host list %q", hostList)
			}
			if _, _, err := net.SplitHostPort(h); err != nil {
				h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
			}
			host, port, err := net.SplitHostPort(h)
			if err != nil || host == "" || strings.ContainsAny(host, "[]/@") {
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
		return nil, fmt.Errorf("rueidis: %w", err)
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
	if err := boolean("cluster", &c.cluster); err != nil {
		return nil, err
	}
	if err := str("sentinel_master", &c.sentinelMaster); err != nil {
		return nil, err
	}
	if err := str("sentinel_username", &c.sentinelUser); err != nil {
		return nil, err
	}
	if err := str("sentinel_password", &c.sentinelPass); err != nil {
		return nil, err
	}
	if err := boolean("tls", &c.tls); err != nil {
		return nil, err
	}
	if err := boolean("insecure_skip_verify", &c.insecureTLS); err != nil {
		return nil, err
	}
	if err := boolean("allow_replica", &c.allowReplica); err != nil {
		return nil, err
	}
	if err := str("client_name", &c.clientName); err != nil {
		return nil, err
	}
	if s, ok, err := get("dial_timeout"); err != nil {
		return nil, err
	} else if ok {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, invalid("dial_timeout=%q: want a positive Go duration such as 5s", s)
		}
		c.dialTimeout = d
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
		return nil, invalid("insecure_skip_verify needs tls=true")
	}
	return c, nil
}

// splitHosts cuts the host list out of dsn: it returns the list and dsn
// with the list replaced by a placeholder host, for url.Parse.
func splitHosts(dsn string) (hosts, rest string, err error) {
	i := strings.Index(dsn, "://")
	if i < 0 {
		return "", dsn, nil // url.Parse reports the problem
	}
	auth := dsn[i+3:]
	end := strings.IndexAny(auth, "/?#")
	if end < 0 {
		end = len(auth)
	}
	auth, tail := auth[:end], auth[end:]
	user := ""
	if at := strings.LastIndexByte(auth, '@'); at >= 0 {
		user, auth = auth[:at+1], auth[at+1:]
	}
	if auth == "" {
		return "", dsn[:i+3] + user + tail, nil
	}
	return auth, dsn[:i+3] + user + "hosts" + tail, nil
}

// tlsConfig returns the TLS configuration for host, or nil without tls=true.
func (c *config) tlsConfig(addr string) *tls.Config {
	if !c.tls {
		return nil
	}
	host, _, _ := net.SplitHostPort(addr)
	return &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.insecureTLS} //nolint:gosec // opt-in
}
