package rediscore

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
)

// URL is the part of a Redis driver's URL that both drivers share:
//
//	scheme://[[username]:password@]host[:port][,host[:port]...][/db][?param=value&...]
//
// with the query parameters cluster, sentinel_master, sentinel_username,
// sentinel_password, insecure_skip_verify, allow_replica, allow_eviction,
// client_name, dial_timeout and those of ParseOptions. How TLS is switched on, and any
// further parameters, are the driver's (see URLSpec).
type URL struct {
	Scheme           string
	Addrs            []string // host:port, at least one
	Username         string
	Password         string
	DB               int
	Cluster          bool
	SentinelMaster   string
	SentinelUsername string
	SentinelPassword string
	TLS              bool // set by URLSpec.TLS
	InsecureTLS      bool // insecure_skip_verify
	AllowReplica     bool
	// AllowEviction (allow_eviction) accepts servers whose maxmemory-policy
	// can evict lock keys; see CheckEviction.
	AllowEviction bool
	ClientName    string
	DialTimeout   time.Duration
	Options       Options // with defaults applied
}

// Mode names the deployment the URL describes: "cluster", "sentinel",
// "redlock" (several hosts, neither cluster nor sentinel) or "single".
func (u *URL) Mode() string {
	switch {
	case u.Cluster:
		return "cluster"
	case u.SentinelMaster != "":
		return "sentinel"
	case len(u.Addrs) > 1:
		return "redlock"
	}
	return "single"
}

// URLSpec is what differs between the drivers' URLs.
type URLSpec struct {
	// Driver names the driver at the start of every error: "redis".
	Driver string
	// Schemes are the URL schemes the driver accepts.
	Schemes []string
	// WantSchemes names them in the error for another scheme:
	// `redis or rediss`.
	WantSchemes string
	// DialTimeout is the default of dial_timeout.
	DialTimeout time.Duration
	// TLS sets u.TLS, from u.Scheme or from a query parameter of its own.
	// It runs after sentinel_password is read and before
	// insecure_skip_verify; nil leaves TLS off.
	TLS func(u *URL, q *Query) error
	// TLSHint completes "insecure_skip_verify needs ...": how a URL
	// switches TLS on ("tls=true").
	TLSHint string
	// Params, if not nil, reads the driver's own query parameters. It runs
	// after the shared ones and before the leftovers are rejected as
	// unknown.
	Params func(q *Query) error
}

// Invalid returns an error "<drv>: <message>" wrapping driver.ErrInvalid.
func Invalid(drv, format string, args ...any) error {
	return fmt.Errorf(drv+": "+format+": %w", append(args, driver.ErrInvalid)...)
}

// ParseURL parses raw as spec describes; see URL for the format. The port
// defaults to 6379 and the host list to 127.0.0.1:6379. An unknown query
// parameter, one given twice, a malformed value or contradicting
// parameters are errors; every error wraps driver.ErrInvalid, starts with
// spec.Driver and never contains the password.
func ParseURL(raw string, spec URLSpec) (*URL, error) {
	u, rawQuery, err := parseAddress(raw, spec)
	if err != nil {
		return nil, err
	}
	v, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, Invalid(spec.Driver, "malformed query (%v)", err)
	}
	fairAsked := len(v["fair"]) == 1 && !isBarging(v["fair"][0])
	if err := u.parseQuery(v, spec); err != nil {
		return nil, err
	}
	if err := u.checkCombination(spec, fairAsked); err != nil {
		return nil, err
	}
	if u.Mode() == "redlock" {
		u.Options.Barging = true
	}
	return u, nil
}

// parseAddress parses everything in raw but the query: the scheme, the
// credentials, the host list and the database number. It returns the raw
// query with them.
func parseAddress(raw string, spec URLSpec) (*URL, string, error) {
	// The host list is split by hand: url.Parse accepts only one host, so
	// "h1,h2:7001" or a list with IPv6 literals would not parse.
	hostList, rest := splitHosts(raw)
	pu, err := url.Parse(rest)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // the URL itself may hold a password
		}
		return nil, "", Invalid(spec.Driver, "malformed URL (%v)", err)
	}
	if !slices.Contains(spec.Schemes, pu.Scheme) {
		return nil, "", Invalid(spec.Driver, "URL scheme %q: want %s", pu.Scheme, spec.WantSchemes)
	}
	if pu.Opaque != "" {
		return nil, "", Invalid(spec.Driver, "malformed URL: want %s://host:port", pu.Scheme)
	}
	u := &URL{Scheme: pu.Scheme, DialTimeout: spec.DialTimeout}
	if pu.User != nil {
		u.Username = pu.User.Username()
		u.Password, _ = pu.User.Password()
	}
	if u.Addrs, err = parseHosts(spec.Driver, hostList); err != nil {
		return nil, "", err
	}
	if u.DB, err = parseDB(spec.Driver, pu.Path); err != nil {
		return nil, "", err
	}
	return u, pu.RawQuery, nil
}

// parseHosts parses a comma-separated host list, each host with an
// optional port (default 6379); an empty list is 127.0.0.1:6379. Errors
// start with drv and wrap driver.ErrInvalid.
func parseHosts(drv, hostList string) ([]string, error) {
	if hostList == "" {
		return []string{"127.0.0.1:6379"}, nil
	}
	var addrs []string
	for _, h := range strings.Split(hostList, ",") {
		if h == "" {
			return nil, Invalid(drv, "empty host in host list %q", hostList)
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil || host == "" || strings.ContainsAny(host, "[]/@") {
			return nil, Invalid(drv, "malformed host %q", h)
		}
		if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
			return nil, Invalid(drv, "malformed port in host %q", h)
		}
		if slices.Contains(addrs, h) {
			return nil, Invalid(drv, "host %q listed twice", h)
		}
		addrs = append(addrs, h)
	}
	return addrs, nil
}

// parseDB parses the URL path: empty or "/" for database 0, else "/n".
func parseDB(drv, path string) (int, error) {
	p := strings.Trim(path, "/")
	if p == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 {
		return 0, Invalid(drv, "path %q: want a database number such as /0", path)
	}
	return n, nil
}

// parseQuery reads the query parameters of v into u, in order: the shared
// options (ParseOptions), the shared URL parameters, the TLS switch and
// the driver's own (spec), and then rejects whatever is left as unknown.
func (u *URL) parseQuery(v url.Values, spec URLSpec) error {
	var err error
	if u.Options, err = ParseOptions(v); err != nil {
		// ParseOptions's errors start with "redis:"; name any other driver
		// in front.
		if !strings.HasPrefix(err.Error(), spec.Driver+": ") {
			err = fmt.Errorf("%s: %w", spec.Driver, err)
		}
		return err
	}
	q := &Query{Driver: spec.Driver, Values: v}
	for _, f := range []func() error{
		func() error { return q.Bool("cluster", &u.Cluster) },
		func() error { return q.String("sentinel_master", &u.SentinelMaster) },
		func() error { return q.String("sentinel_username", &u.SentinelUsername) },
		func() error { return q.String("sentinel_password", &u.SentinelPassword) },
		func() error {
			if spec.TLS == nil {
				return nil
			}
			return spec.TLS(u, q)
		},
		func() error { return q.Bool("insecure_skip_verify", &u.InsecureTLS) },
		func() error { return q.Bool("allow_replica", &u.AllowReplica) },
		func() error { return q.Bool("allow_eviction", &u.AllowEviction) },
		func() error { return q.String("client_name", &u.ClientName) },
		func() error { return q.Duration("dial_timeout", &u.DialTimeout) },
		func() error {
			if spec.Params == nil {
				return nil
			}
			return spec.Params(q)
		},
	} {
		if err := f(); err != nil {
			return err
		}
	}
	return q.Unknown()
}

// checkCombination rejects parameters that contradict each other or the
// deployment. fairAsked: the URL said fair=true.
func (u *URL) checkCombination(spec URLSpec, fairAsked bool) error {
	invalid := func(format string, args ...any) error { return Invalid(spec.Driver, format, args...) }
	switch {
	case u.Cluster && u.SentinelMaster != "":
		return invalid("cluster=true and sentinel_master are mutually exclusive")
	case (u.SentinelUsername != "" || u.SentinelPassword != "") && u.SentinelMaster == "":
		return invalid("sentinel_username/sentinel_password need sentinel_master")
	case u.Cluster && u.DB != 0:
		return invalid("a Redis Cluster has only database 0, not %d", u.DB)
	case u.AllowReplica && (u.Cluster || u.SentinelMaster != ""):
		return invalid("allow_replica applies to single-node and Redlock URLs only")
	case u.InsecureTLS && !u.TLS:
		return invalid("insecure_skip_verify needs %s", spec.TLSHint)
	case fairAsked && u.Mode() == "redlock":
		return invalid("fair=true: Redlock does not queue waiters (see the package documentation, Fairness); drop the parameter")
	}
	return nil
}

// TLSConfig returns the TLS configuration of the URL's connections, or nil
// without TLS: TLS 1.2 at least, the server certificate verified unless
// insecure_skip_verify=true. serverName is the name verified; empty
// verifies each connection against the host it dials.
func (u *URL) TLSConfig(serverName string) *tls.Config {
	if !u.TLS {
		return nil
	}
	return &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12, InsecureSkipVerify: u.InsecureTLS} //nolint:gosec // opt-in
}

// isBarging reports whether a fair= value turns the queue off (a malformed
// value is rejected by ParseOptions).
func isBarging(v string) bool {
	f, err := strconv.ParseBool(v)
	return err != nil || !f
}

// splitHosts cuts the host list out of raw: it returns the list and raw
// with the list replaced by a placeholder host, for url.Parse. raw is
// returned as it is if it has no authority or an empty host list.
func splitHosts(raw string) (hosts, rest string) {
	i := strings.Index(raw, "://")
	if i < 0 {
		return "", raw // url.Parse reports the problem
	}
	auth := raw[i+3:]
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
		return "", raw
	}
	return auth, raw[:i+3] + user + "hosts" + tail
}

// Query reads query parameters, deleting each one it reads from Values so
// that whatever is left can be rejected as unknown. A parameter given more
// than once, or with a malformed value, is an error wrapping
// driver.ErrInvalid that starts with Driver.
type Query struct {
	Driver string
	Values url.Values
}

// Get returns the value of the parameter name and whether it was given.
func (q *Query) Get(name string) (string, bool, error) {
	vs, ok := q.Values[name]
	if !ok {
		return "", false, nil
	}
	delete(q.Values, name)
	if len(vs) != 1 {
		return "", false, Invalid(q.Driver, "query parameter %q given %d times", name, len(vs))
	}
	return vs[0], true, nil
}

// Bool sets *dst to the boolean parameter name, if given.
func (q *Query) Bool(name string, dst *bool) error {
	s, ok, err := q.Get(name)
	if err != nil || !ok {
		return err
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		return Invalid(q.Driver, "%s=%q: want true or false", name, s)
	}
	*dst = b
	return nil
}

// String sets *dst to the parameter name, if given; it must not be empty.
func (q *Query) String(name string, dst *string) error {
	s, ok, err := q.Get(name)
	if err != nil || !ok {
		return err
	}
	if s == "" {
		return Invalid(q.Driver, "%s must not be empty", name)
	}
	*dst = s
	return nil
}

// Duration sets *dst to the parameter name, if given: a positive Go
// duration.
func (q *Query) Duration(name string, dst *time.Duration) error {
	return q.duration(name, dst, "5s")
}

// duration is Duration with example, a duration shown in the error.
func (q *Query) duration(name string, dst *time.Duration, example string) error {
	s, ok, err := q.Get(name)
	if err != nil || !ok {
		return err
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return Invalid(q.Driver, "%s=%q: want a positive Go duration such as %s", name, s, example)
	}
	*dst = d
	return nil
}

// PositiveInt sets *dst to the parameter name, if given: a positive
// integer.
func (q *Query) PositiveInt(name string, dst *int) error {
	s, ok, err := q.Get(name)
	if err != nil || !ok {
		return err
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return Invalid(q.Driver, "%s=%q: want a positive integer", name, s)
	}
	*dst = n
	return nil
}

// Unknown returns an error naming, sorted, every parameter left in Values
// (none read it), or nil if none is left.
func (q *Query) Unknown() error {
	if len(q.Values) == 0 {
		return nil
	}
	names := make([]string, 0, len(q.Values))
	for k := range q.Values {
		names = append(names, k)
	}
	slices.Sort(names)
	return Invalid(q.Driver, "unknown query parameter(s) %s", strings.Join(names, ", "))
}
