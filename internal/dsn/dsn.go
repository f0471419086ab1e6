// Package dsn holds the strict URL (data source name) parsing the drivers
// share: the URL itself, a host:port list, and query parameters read one by
// one with range checks, the leftovers rejected as unknown.
//
// Every error it returns wraps driver.ErrInvalid and reads
// "<driver>: <message>: invalid argument", where <driver> is the name the
// caller passes (for example "etcd"). No error contains the URL's password:
// a malformed URL is reported by its reason only, and String and Lookup
// never echo a parameter's value.
//
// A driver parses a URL in three steps:
//
//	u, err := dsn.Parse("etcd", raw, `"etcd"`, "etcd")
//	q, err := dsn.NewQuery("etcd", u)
//	err = q.Duration("dial_timeout", &c.dial, dsn.Positive, 0)
//	…
//	err = q.Done() // any parameter not read above is an error naming it
package dsn

import (
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

// Invalid returns the error "<drv>: <message>: invalid argument", wrapping
// driver.ErrInvalid, with message formatted from format and args.
func Invalid(drv, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", drv, fmt.Sprintf(format, args...), driver.ErrInvalid)
}

// Parse parses raw as a URL whose scheme is one of schemes (url.Parse
// lowers the scheme, so "FILE://" is "file"). want names the accepted
// schemes in the error for any other scheme, for example `"etcd"` or
// "redis or rediss". A URL with a fragment is refused. The caller checks
// the rest (opaque form, user, host, path).
//
// Errors wrap driver.ErrInvalid: "malformed URL: <reason>" (without the
// URL, which may hold a password), "URL scheme %q, want <want>", "URL has a
// fragment".
func Parse(drv, raw, want string, schemes ...string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // ue quotes the whole URL, password included
		}
		return nil, Invalid(drv, "malformed URL: %v", err)
	}
	if !slices.Contains(schemes, u.Scheme) {
		return nil, Invalid(drv, "URL scheme %q, want %s", u.Scheme, want)
	}
	if u.Fragment != "" {
		return nil, Invalid(drv, "URL has a fragment")
	}
	return u, nil
}

// HostPorts splits a comma-separated list of host:port pairs, such as the
// host part of "etcd://h1:2379,h2:2379". defaultPort, if not empty, is the
// port of a host given without one; if empty, every host needs a port.
// IPv6 hosts are written in brackets: "[::1]:2379".
//
// Errors wrap driver.ErrInvalid and name the bad entry: an empty list or
// entry, a missing host or port, a port outside 1–65535, or a pair listed
// twice.
func HostPorts(drv, list, defaultPort string) ([]string, error) {
	if list == "" {
		return nil, Invalid(drv, "URL has no host")
	}
	var out []string
	for _, h := range strings.Split(list, ",") {
		if h == "" {
			return nil, Invalid(drv, "empty host in host list %q", list)
		}
		if _, _, err := net.SplitHostPort(h); err != nil && defaultPort != "" {
			h = net.JoinHostPort(strings.Trim(h, "[]"), defaultPort)
		}
		host, port, err := net.SplitHostPort(h)
		switch {
		case err != nil:
			return nil, Invalid(drv, "host %q: want host:port", h)
		case host == "" || strings.ContainsAny(host, "[]/@"):
			return nil, Invalid(drv, "host %q: empty or malformed host name", h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, Invalid(drv, "host %q: port must be 1 to 65535", h)
		}
		if slices.Contains(out, h) {
			return nil, Invalid(drv, "host %q listed twice", h)
		}
		out = append(out, h)
	}
	return out, nil
}

// Query reads a URL's query parameters one by one. Each method takes one
// parameter out, so that Done can reject whatever is left as unknown. A
// parameter given more than once is an error, whichever method reads it.
// A Query is not safe for concurrent use.
type Query struct {
	drv    string
	values url.Values
	known  []string // every name asked for, for Done's error
}

// NewQuery parses u's query for driver drv. A malformed query (a bad
// percent escape) is an error wrapping driver.ErrInvalid: "malformed
// query: <reason>".
func NewQuery(drv string, u *url.URL) (*Query, error) {
	v, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, Invalid(drv, "malformed query: %v", err)
	}
	return &Query{drv: drv, values: v}, nil
}

// Invalid returns an error for this Query's driver; see the package
// function Invalid.
func (q *Query) Invalid(format string, args ...any) error {
	return Invalid(q.drv, format, args...)
}

// Lookup takes the parameter name out of the query and returns its value
// and whether it was given (an empty value counts as given). The error,
// for a parameter given more than once, wraps driver.ErrInvalid and does
// not contain the values.
func (q *Query) Lookup(name string) (string, bool, error) {
	if !slices.Contains(q.known, name) {
		q.known = append(q.known, name)
	}
	vs, ok := q.values[name]
	if !ok {
		return "", false, nil
	}
	delete(q.values, name)
	if len(vs) != 1 {
		return "", false, q.Invalid("query parameter %q given %d times", name, len(vs))
	}
	return vs[0], true, nil
}

// String sets *dst to the parameter name if it was given with a non-empty
// value; *dst is unchanged if it was not given. An empty value is an error
// wrapping driver.ErrInvalid. Errors never contain the value, so String
// suits passwords.
func (q *Query) String(name string, dst *string) error {
	v, ok, err := q.Lookup(name)
	if err != nil || !ok {
		return err
	}
	if v == "" {
		return q.Invalid("query parameter %s is empty", name)
	}
	*dst = v
	return nil
}

// Bool sets *dst to the parameter name if it was given: a value
// strconv.ParseBool accepts (true, false, 1, 0, t, f, …). Anything else is
// an error wrapping driver.ErrInvalid: "query parameter name="v": want true
// or false".
func (q *Query) Bool(name string, dst *bool) error {
	v, ok, err := q.Lookup(name)
	if err != nil || !ok {
		return err
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return q.Invalid("query parameter %s=%q: want true or false", name, v)
	}
	*dst = b
	return nil
}

// Positive is the smallest positive duration, the min of Duration for a
// parameter that must be above zero.
const Positive = time.Nanosecond

// Duration sets *dst to the parameter name if it was given: a Go duration
// ("5s", "1m30s") of at least min and, unless max is 0, at most max. Out
// of range or malformed, it is an error wrapping driver.ErrInvalid that
// names the parameter, its value and the range: "query parameter name="v":
// want a positive duration such as 5s" when min is Positive and max 0.
func (q *Query) Duration(name string, dst *time.Duration, min, max time.Duration) error {
	v, ok, err := q.Lookup(name)
	if err != nil || !ok {
		return err
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < min || max != 0 && d > max {
		var want string
		switch {
		case min == Positive && max == 0:
			want = "a positive duration such as 5s"
		case max == 0:
			want = fmt.Sprintf("a duration ≥ %v", min)
		default:
			want = fmt.Sprintf("a duration from %v to %v", min, max)
		}
		return q.Invalid("query parameter %s=%q: want %s", name, v, want)
	}
	*dst = d
	return nil
}

// Int sets *dst to the parameter name if it was given: a decimal integer
// from min to max. Out of range or malformed, it is an error wrapping
// driver.ErrInvalid: "query parameter name="v": want an integer from min to
// max".
func (q *Query) Int(name string, dst *int, min, max int) error {
	v, ok, err := q.Lookup(name)
	if err != nil || !ok {
		return err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		return q.Invalid("query parameter %s=%q: want an integer from %d to %d", name, v, min, max)
	}
	*dst = n
	return nil
}

// Done returns nil if every parameter of the query was read, and
// otherwise an error wrapping driver.ErrInvalid that names the first
// unknown parameter in sorted order and lists the known ones: `unknown
// query parameter "ttl" (known: perm)`. It does not echo the value.
func (q *Query) Done() error {
	if len(q.values) == 0 {
		return nil
	}
	names := make([]string, 0, len(q.values))
	for k := range q.values {
		names = append(names, k)
	}
	slices.Sort(names)
	known := slices.Sorted(slices.Values(q.known))
	if len(known) == 0 {
		return q.Invalid("unknown query parameter %q (%s takes none)", names[0], q.drv)
	}
	return q.Invalid("unknown query parameter %q (known: %s)", names[0], strings.Join(known, ", "))
}
