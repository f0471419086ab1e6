//go:build !linux

package postgres

import (
	"errors"
	"net"
)

// sessionWatcher needs epoll; elsewhere WatchHold reports the watch
// unsupported and package locker relies on renewal alone.
type sessionWatcher struct{}

type sessionWatch struct{}

func newSessionWatcher() (*sessionWatcher, error) {
	return nil, errors.ErrUnsupported
}

func (*sessionWatcher) add(net.Conn, func(*hold, error), *hold) (*sessionWatch, error) {
	return nil, errors.ErrUnsupported
}

func (*sessionWatch) remove() {}

func (*sessionWatcher) close() {}
