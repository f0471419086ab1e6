package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-locker/locker/driver"
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
	return fmt.Errorf("etcd: %s: %w", fmt.Sprintf(format, args...), driver.ErrInvalid)
}

// parseDSN parses etcd://[user:password@]host:port[,host:port…][/prefix][?params].
func parseDSN(dsn string) (*config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		// url.Error quotes the whole URL, password included; keep only
		// the reason.
		var ue *url.Error
		reason := err
		if e, ok := err.(*url.Error); ok {
			ue = e
			reason = ue.Err
		}
		return nil, invalid("malformed URL: %v", reason)
	}
	if u.Scheme != "etcd" {
		return nil, invalid("URL scheme %q, want \"etcd\"", u.Scheme)
	}
	if u.Opaque != "" {
		return nil, invalid("URL must be etcd://host:port[,host:port…][/prefix]")
	}
	if u.Fragment != "" {
		return nil, invalid("URL has a fragment")
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
	if u.Host == "" {
		return nil, invalid("URL has no host")
	}
	for _, h := range strings.Split(u.Host, ",") {
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			return nil, invalid("endpoint %q: want host:port", h)
		}
		if host == "" {
			return nil, invalid("endpoint %q: empty host", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, invalid("endpoint %q: bad port", h)
		}
		c.endpoints = append(c.endpoints, h)
	}
	if c.prefix, err = cleanPrefix(u.Path); err != nil {
		return nil, err
	}

	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, invalid("malformed query: %v", err)
	}
	var (
		useTLS                             bool
		caFile, certFile, keyFile, srvName string
		skipVerify                         bool
	)
	for name, vals := range q {
		if len(vals) != 1 {
			return nil, invalid("query parameter %q given %d times", name, len(vals))
		}
		v := vals[0]
		var err error
		switch name {
		case "dial_timeout":
			c.dialTimeout, err = positiveDuration(name, v)
		case "request_timeout":
			c.requestTimeout, err = positiveDuration(name, v)
		case "keepalive_time":
			c.keepAliveTime, err = positiveDuration(name, v)
		case "keepalive_timeout":
			c.keepAliveTimeout, err = positiveDuration(name, v)
		case "auto_sync_interval":
			c.autoSync, err = time.ParseDuration(v)
			if err != nil || c.autoSync < 0 {
				err = invalid("query parameter %s=%q: want a duration ≥ 0", name, v)
			}
		case "min_ttl":
			c.minTTL, err = positiveDuration(name, v)
			if err == nil && c.minTTL%time.Second != 0 {
				err = invalid("query parameter min_ttl=%q: want whole seconds", v)
			}
		case "tls":
			useTLS, err = parseBool(name, v)
		case "ca_file":
			caFile, useTLS = v, true
		case "cert_file":
			certFile, useTLS = v, true
		case "key_file":
			keyFile, useTLS = v, true
		case "server_name":
			srvName, useTLS = v, true
		case "insecure_skip_verify":
			skipVerify, err = parseBool(name, v)
			useTLS = useTLS || skipVerify
		default:
			return nil, invalid("unknown query parameter %q", name)
		}
		if err != nil {
			return nil, err
		}
	}
	if useTLS {
		if c.tls, err = tlsConfig(caFile, certFile, keyFile, srvName, skipVerify); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func positiveDuration(name, v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, invalid("query parameter %s=%q: want a positive duration such as 5s", name, v)
	}
	return d, nil
}

func parseBool(name, v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, invalid("query parameter %s=%q: want true or false", name, v)
	}
	return b, nil
}

// cleanPrefix validates a key prefix taken from a URL path or Options: "" or
// "/" mean DefaultPrefix; otherwise "/seg[/seg…]" with non-empty segments
// other than "." and "..", made of printable UTF-8; a trailing "/" is
// dropped.
func cleanPrefix(p string) (string, error) {
	if p == "" || p == "/" {
		return DefaultPrefix, nil
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	p = strings.TrimSuffix(p, "/")
	if !utf8.ValidString(p) {
		return "", invalid("key prefix %q is not valid UTF-8", p)
	}
	for _, r := range p {
		if !unicode.IsPrint(r) || r == ' ' {
			return "", invalid("key prefix %q has a space or non-printable character", p)
		}
	}
	for _, seg := range strings.Split(p[1:], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", invalid("key prefix %q has an empty, \".\" or \"..\" segment", p)
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
