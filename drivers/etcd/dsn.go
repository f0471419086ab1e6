package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-locker/locker/internal/dsn"
)

// Defaults for the URL query parameters and Options.
const (
	// DefaultPrefix is the key prefix used when the URL has no path.
	DefaultPrefix = "/locker"
	// DefaultMinTTL is the shortest TTL the driver accepts. etcd refuses
	// leases shorter than 1.5 election timeouts (1.5s with the default
	// 1s election timeout) and rounds lease TTLs to whole seconds.
	DefaultMinTTL = 2 * time.Second
	// DefaultDialTimeout bounds the initial connection.
	DefaultDialTimeout = 5 * time.Second
	// DefaultRequestTimeout bounds every request; a context whose deadline
	// comes sooner bounds it sooner.
	DefaultRequestTimeout = 10 * time.Second
	// DefaultKeepAliveTime is the gRPC keepalive ping interval.
	DefaultKeepAliveTime = 10 * time.Second
	// DefaultKeepAliveTimeout is how long an unanswered keepalive ping
	// takes to close the connection.
	DefaultKeepAliveTimeout = 5 * time.Second
)

// config is a parsed data source name.
type config struct {
	endpoints        []string
	prefix           string
	username         string
	password         string
	tls              *tls.Config
	dialTimeout      time.Duration
	requestTimeout   time.Duration
	keepAliveTime    time.Duration
	keepAliveTimeout time.Duration
	autoSync         time.Duration
	minTTL           time.Duration
}

func invalid(format string, args ...any) error {
	return dsn.Invalid(Scheme, format, args...)
}

// parseDSN parses etcd://[user:password@]host:port[,host:port…][/prefix][?params].
// Every error wraps driver.ErrInvalid and leaves the password out.
func parseDSN(raw string) (*config, error) {
	u, err := dsn.Parse(Scheme, raw, `"etcd"`, Scheme)
	if err != nil {
		return nil, err
	}
	if u.Opaque != "" {
		return nil, invalid("URL must be etcd://host:port[,host:port…][/prefix]")
	}
	c := &config{
		dialTimeout:      DefaultDialTimeout,
		requestTimeout:   DefaultRequestTimeout,
		keepAliveTime:    DefaultKeepAliveTime,
		keepAliveTimeout: DefaultKeepAliveTimeout,
		minTTL:           DefaultMinTTL,
	}
	if u.User != nil {
		c.username = u.User.Username()
		c.password, _ = u.User.Password()
		if c.username == "" {
			return nil, invalid("URL has a password but no user name")
		}
	}
	if c.endpoints, err = dsn.HostPorts(Scheme, u.Host, ""); err != nil {
		return nil, err
	}
	if c.prefix, err = cleanPrefix(u.Path); err != nil {
		return nil, err
	}
	if err := c.parseQuery(u); err != nil {
		return nil, err
	}
	return c, nil
}

// parseQuery reads the query parameters of u into c.
func (c *config) parseQuery(u *url.URL) error {
	q, err := dsn.NewQuery(Scheme, u)
	if err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		dst  *time.Duration
		min  time.Duration
	}{
		{"dial_timeout", &c.dialTimeout, dsn.Positive},
		{"request_timeout", &c.requestTimeout, dsn.Positive},
		{"keepalive_time", &c.keepAliveTime, dsn.Positive},
		{"keepalive_timeout", &c.keepAliveTimeout, dsn.Positive},
		{"auto_sync_interval", &c.autoSync, 0},
		{"min_ttl", &c.minTTL, dsn.Positive},
	} {
		if err := q.Duration(p.name, p.dst, p.min, 0); err != nil {
			return err
		}
	}
	if c.minTTL%time.Second != 0 {
		return invalid("query parameter min_ttl=%q: want whole seconds", c.minTTL)
	}
	tp, err := readTLS(q)
	if err != nil {
		return err
	}
	if err := q.Done(); err != nil {
		return err
	}
	if tp.on {
		c.tls, err = tlsConfig(tp.files[0], tp.files[1], tp.files[2], tp.files[3], tp.skipVerify)
	}
	return err
}

// tlsParams are the TLS query parameters.
type tlsParams struct {
	on, skipVerify bool
	files          [4]string // ca_file, cert_file, key_file, server_name
}

// readTLS reads the TLS parameters: tls=true, or any of ca_file,
// cert_file, key_file, server_name and insecure_skip_verify=true, turns
// TLS on; tls=false with any of those is a contradiction.
func readTLS(q *dsn.Query) (tlsParams, error) {
	var (
		tp      tlsParams
		implied string // a parameter that implies TLS
	)
	for i, name := range []string{"ca_file", "cert_file", "key_file", "server_name"} {
		v, ok, err := q.Lookup(name)
		if err != nil {
			return tp, err
		}
		if ok {
			tp.files[i], implied = v, name
		}
	}
	if err := q.Bool("insecure_skip_verify", &tp.skipVerify); err != nil {
		return tp, err
	}
	if tp.skipVerify {
		implied = "insecure_skip_verify"
	}
	v, given, err := q.Lookup("tls")
	if err != nil {
		return tp, err
	}
	if given {
		if tp.on, err = strconv.ParseBool(v); err != nil {
			return tp, invalid("query parameter tls=%q: want true or false", v)
		}
		if !tp.on && implied != "" {
			return tp, invalid("query parameters tls=false and %s contradict each other", implied)
		}
	}
	tp.on = tp.on || implied != ""
	return tp, nil
}

// cleanPrefix validates a key prefix taken from a URL path or Options: ""
// or "/" mean DefaultPrefix; otherwise "/seg[/seg…]" (a missing leading "/"
// is added, a trailing "/" dropped). A segment is any non-empty bytes
// (spaces, colons, newlines and non-UTF-8 included) other than "." and
// "..", and other than "l", "w", "s" and "rw", the names of the driver's
// own key spaces under a prefix: since no prefix has those segments, no
// key under one prefix is a key under another.
func cleanPrefix(p string) (string, error) {
	if p == "" || p == "/" {
		return DefaultPrefix, nil
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	p = strings.TrimSuffix(p, "/")
	for seg := range strings.SplitSeq(p[1:], "/") {
		switch seg {
		case "", ".", "..":
			return "", invalid("key prefix %q has an empty, \".\" or \"..\" segment", p)
		case "l", "w", "s", "rw":
			return "", invalid("key prefix %q has a segment %q, which the driver reserves for its keys", p, seg)
		}
	}
	return p, nil
}

func tlsConfig(caFile, certFile, keyFile, serverName string, skipVerify bool) (*tls.Config, error) {
	tc := &tls.Config{ServerName: serverName, InsecureSkipVerify: skipVerify, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, invalid("ca_file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalid("ca_file %q holds no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, invalid("cert_file and key_file must be given together")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, invalid("client certificate: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
