package rediscore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/go-locker/locker/driver"
)

// unreachable are substrings of client errors that say the server could
// not be reached or would not serve: network failures, TLS and
// authentication failures at connect, and a server not ready to serve
// (loading its data, its master or cluster down).
var unreachable = []string{
	"connection refused", "connection reset", "broken pipe", "i/o timeout", "no such host",
	"network is unreachable", "no route to host", "all sentinels", "connection pool timeout",
	"x509:", "tls:", "WRONGPASS", "NOAUTH", "invalid password", "invalid username-password",
	"LOADING", "MASTERDOWN", "CLUSTERDOWN", "no reachable server", "not connected",
}

// Unreachable reports whether err says the server could not be reached at
// all (see driver.ErrUnavailable): a refused, reset or timed-out
// connection, a failed TLS handshake or authentication, a server still
// loading its data or whose master or cluster is down. A reply from a
// serving server (a script error, a wrong type) is not.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, driver.ErrUnavailable) {
		return true
	}
	var (
		ne net.Error
		oe *net.OpError
		rh tls.RecordHeaderError
		ua x509.UnknownAuthorityError
		ci x509.CertificateInvalidError
		hn x509.HostnameError
		ve *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &oe), errors.As(err, &ne),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &rh), errors.As(err, &ua), errors.As(err, &ci), errors.As(err, &hn), errors.As(err, &ve):
		return true
	}
	s := err.Error()
	for _, sub := range unreachable {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// MarkUnavailable returns err wrapped so that errors.Is(err,
// driver.ErrUnavailable) holds when Unreachable(err); any other err (and
// nil) comes back unchanged.
func MarkUnavailable(err error) error {
	if err == nil || errors.Is(err, driver.ErrUnavailable) || !Unreachable(err) {
		return err
	}
	return &unavailableError{err}
}

// unavailableError wraps a client error in driver.ErrUnavailable without
// changing its message.
type unavailableError struct{ err error }

func (e *unavailableError) Error() string   { return e.err.Error() }
func (e *unavailableError) Unwrap() []error { return []error{e.err, driver.ErrUnavailable} }

// AsUnavailable returns err wrapped so that errors.Is(err,
// driver.ErrUnavailable) holds, its message unchanged; nil stays nil. It is
// for failures the caller knows mean "not reached": a failed connect, too
// few Redlock nodes answering.
func AsUnavailable(err error) error {
	if err == nil || errors.Is(err, driver.ErrUnavailable) {
		return err
	}
	return &unavailableError{err}
}
