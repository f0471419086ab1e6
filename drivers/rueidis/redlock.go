package rueidis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/rueidis"

	"github.com/go-locker/locker/driver"
	"github.com/go-locker/locker/internal/rediscore"
)

// master is one Redlock master. rueidis dials eagerly and fails when the
// server is down, so Open starts with the masters that answer (a quorum at
// least) and dials the others again in the background when they are used:
// a call to a master that is not connected fails at once, and counts as
// that master's failure in the quorum.
type master struct {
	addr string
	opt  rueidis.ClientOption
	cfg  *config

	mu      sync.Mutex
	client  rueidis.Client
	dialing bool
	err     error // why the last dial failed
	closed  bool
	wg      sync.WaitGroup
}

// get returns the master's client, or starts dialling it and returns an
// error naming the last failure.
func (m *master) get() (rueidis.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.client != nil {
		return m.client, nil
	}
	if m.closed {
		return nil, fmt.Errorf("rueidis: %w", driver.ErrClosed)
	}
	if !m.dialing {
		m.dialing = true
		m.wg.Add(1)
		go m.dial()
	}
	return nil, rediscore.AsUnavailable(fmt.Errorf("rueidis: %s: not connected (redialling): %w", m.addr, m.err))
}

// current returns the client if connected, else nil (without dialling).
func (m *master) current() rueidis.Client {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.client
}

// connect dials the master and checks its role; it is Open's first
// attempt, bounded by ctx.
func (m *master) connect(ctx context.Context) error {
	cl, err := m.checked(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.err = err
		return err
	}
	m.client = cl
	return nil
}

// checked dials the master and checks it (its role and eviction policy),
// bounded by ctx: a client that failed the check is closed.
func (m *master) checked(ctx context.Context) (rueidis.Client, error) {
	cl, err := newClient(ctx, m.opt, m.addr)
	if err != nil {
		return nil, err
	}
	if err = checkMaster(ctx, cl, m.addr, m.cfg); err == nil {
		err = checkEviction(ctx, cl, m.addr, m.cfg)
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}

// dial is a background redial after Open: it is bounded by dial_timeout
// alone.
func (m *master) dial() {
	defer m.wg.Done()
	cl, err := m.checked(context.Background())
	m.mu.Lock()
	defer m.mu.Unlock()
	m.dialing = false
	switch {
	case m.closed && cl != nil:
		cl.Close()
	case err != nil:
		m.err = err
	default:
		m.client = cl
	}
}

// close closes the client and waits for a dial in progress.
func (m *master) close() {
	m.mu.Lock()
	m.closed = true
	cl := m.client
	m.client = nil
	m.mu.Unlock()
	if cl != nil {
		cl.Close()
	}
	m.wg.Wait()
}

// openRedlock connects to every master in parallel and needs a quorum. A
// rejected password, like a replica or an evicting server, fails Open:
// retrying will not cure it.
// ctx bounds the connecting and checking.
func openRedlock(ctx context.Context, c *config, w *cscWaiter) (*Locker, error) {
	ms := make([]*master, len(c.Addrs))
	for i, a := range c.Addrs {
		ms[i] = &master{addr: a, opt: c.clientOption([]string{a}, w), cfg: c}
	}
	authFailed := func(err error) bool { return errors.Is(err, errAuth) }
	if err := rediscore.CheckQuorum(Scheme, len(ms), func(i int) error { return ms[i].connect(ctx) }, authFailed); err != nil {
		for _, m := range ms {
			m.close()
		}
		return nil, err
	}
	conns := make([]rediscore.Conn, len(ms))
	for i, m := range ms {
		conns[i] = &conn{addr: m.addr, m: m}
	}
	w.masters = ms
	return newLocker(w, nil, c.Options, conns...), nil
}

// masterClients returns the clients of the connected masters.
func masterClients(ms []*master) []rueidis.Client {
	out := make([]rueidis.Client, 0, len(ms))
	for _, m := range ms {
		if cl := m.current(); cl != nil {
			out = append(out, cl)
		}
	}
	return out
}
