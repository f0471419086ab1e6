package postgres

import (
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/go-locker/locker/driver"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultPoolMaxConns is the pool size Open uses in advisory mode when the
// URL has no pool_max_conns. In advisory mode every held lock pins one
// connection, and so does every waiter blocked in the server, so the
// server's max_connections is usually the real limit (past it, Acquire
// fails at once with an error wrapping *SlotsError and
// driver.ErrUnavailable rather than waiting for a pooled connection).
const DefaultPoolMaxConns = 256

// DefaultLeasePoolMaxConns is the pool size Open uses in lease mode when
// the URL has no pool_max_conns. Lease mode pins no connection, so a small
// pool serves any number of locks, and it fits a default server
// (max_connections 100) with room for other clients: each lease-mode
// Locker opens at most this many pooled connections plus one reserved for
// renewals and one for release notifications. Acquires beyond the pool
// wait for a pooled connection (bounded by their context); renewals never
// do.
const DefaultLeasePoolMaxConns = 16

// Our own query parameters, removed from the URL before pgx sees it.
const (
	paramSchema    = "schema"
	paramNamespace = "namespace"
	paramMode      = "mode"
)

// The values of the mode parameter.
const (
	// ModeAdvisory (the default) keeps each lock in a session-level
	// advisory lock on a pinned connection.
	ModeAdvisory = "advisory"
	// ModeLease keeps each lock in a row of the lease table; no connection
	// is pinned (see Locker).
	ModeLease = "lease"
)

// pgxParams are the query parameters pgx and pgxpool consume themselves.
// Anything else pgx would send to the server as a run-time setting; we accept
// only application_name and options (use options=-c name=value for server
// settings) and reject the rest, so that a typo is an error rather than a
// silently ignored or misapplied setting.
var pgxParams = map[string]bool{
	// pgconn
	"host": true, "port": true, "database": true, "dbname": true, "user": true, "password": true,
	"passfile": true, "connect_timeout": true, "sslmode": true, "sslkey": true, "sslcert": true,
	"sslcertmode": true, "sslrootcert": true, "sslnegotiation": true, "sslpassword": true,
	"sslsni": true, "krbspn": true, "krbsrvname": true, "target_session_attrs": true,
	"service": true, "servicefile": true, "min_protocol_version": true, "max_protocol_version": true,
	"channel_binding": true, "require_auth": true,
	// pgx
	"statement_cache_capacity": true, "description_cache_capacity": true, "default_query_exec_mode": true,
	// pgxpool
	"pool_max_conns": true, "pool_min_conns": true, "pool_min_idle_conns": true,
	"pool_max_conn_lifetime": true, "pool_max_conn_idle_time": true,
	"pool_health_check_period": true, "pool_max_conn_lifetime_jitter": true,
	// run-time parameters we let through
	"application_name": true, "options": true,
}

// config is a parsed data source name.
type config struct {
	pool      *pgxpool.Config
	schema    string
	namespace string
	mode      string
	modeSet   bool // mode was given in the URL

	// Lease mode's clean-up; zero means LeaseSweepInterval and
	// LeaseSweepAge.
	sweepEvery, sweepAge time.Duration
}

// parseDSN splits a postgres:// or postgresql:// URL into our parameters and
// a pgxpool configuration.
func parseDSN(dsn string) (*config, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: malformed URL: %w", invalid(redact(err)))
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("postgres: URL scheme %q: want postgres:// or postgresql://: %w", u.Scheme, driver.ErrInvalid)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("postgres: malformed query: %w", invalid(err))
	}
	c := &config{schema: DefaultSchema, namespace: DefaultNamespace, mode: ModeAdvisory}
	var unknown []string
	for k, vs := range q {
		if len(vs) != 1 {
			return nil, fmt.Errorf("postgres: query parameter %q given %d times: %w", k, len(vs), driver.ErrInvalid)
		}
		switch {
		case k == paramSchema:
			c.schema = vs[0]
			delete(q, k)
		case k == paramNamespace:
			c.namespace = vs[0]
			delete(q, k)
		case k == paramMode:
			if vs[0] != ModeAdvisory && vs[0] != ModeLease {
				return nil, fmt.Errorf("postgres: mode %q: want %q or %q: %w", vs[0], ModeAdvisory, ModeLease, driver.ErrInvalid)
			}
			c.mode, c.modeSet = vs[0], true
			delete(q, k)
		case !pgxParams[k]:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("postgres: unknown query parameter(s) %s (server settings go in options=-c name=value): %w",
			strings.Join(unknown, ", "), driver.ErrInvalid)
	}
	if err := checkSchema(c.schema); err != nil {
		return nil, err
	}
	if err := checkNamespace(c.namespace); err != nil {
		return nil, err
	}
	_, hasMax := q["pool_max_conns"]
	// Encode writes a space as "+", which pgx's URL parser keeps as a
	// plus sign (options=-c%20name=value would reach the server as
	// "-c+name=value"): write it as %20.
	u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", invalid(err))
	}
	if !hasMax {
		pc.MaxConns = DefaultPoolMaxConns
		if c.mode == ModeLease {
			pc.MaxConns = DefaultLeasePoolMaxConns
		}
	}
	c.pool = pc
	return c, nil
}

func checkSchema(s string) error {
	if s == "" || len(s) > 63 || strings.ContainsRune(s, 0) {
		return fmt.Errorf("postgres: schema %q: want 1 to 63 bytes, no NUL: %w", s, driver.ErrInvalid)
	}
	return nil
}

// invalidError wraps a parse error so that errors.Is(err, driver.ErrInvalid)
// holds while the message stays the parser's.
type invalidError struct{ err error }

func (e invalidError) Error() string { return e.err.Error() }
func (e invalidError) Unwrap() []error {
	return []error{e.err, driver.ErrInvalid}
}

func invalid(err error) error { return invalidError{err} }

// redact drops the URL (which may hold a password) from url.Parse errors.
func redact(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return fmt.Errorf("%s", ue.Err)
	}
	return err
}

// checkNamespace rejects a namespace that contains a NUL byte: keys are
// hashed as namespace, NUL, key (see AdvisoryKey), so with a NUL in the
// namespace two distinct namespace and key pairs could hash alike.
func checkNamespace(ns string) error {
	if strings.IndexByte(ns, 0) >= 0 {
		return fmt.Errorf("postgres: namespace %q contains a NUL byte: %w", ns, driver.ErrInvalid)
	}
	return nil
}
