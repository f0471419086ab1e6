package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// The session probe's schedule.
const (
	// probeInterval is how often the sessions of watched locks are looked
	// up while any is watched.
	probeInterval = 200 * time.Millisecond
	// probeTimeout bounds one look-up; past it the probe's connection is
	// dropped (it may be half-open itself) and the look-up is made again
	// at once on a new one.
	probeTimeout = 300 * time.Millisecond
	// probeConnectTimeout bounds making the probe's connection.
	probeConnectTimeout = 500 * time.Millisecond
	// probeIdle is how long the probe's connection stays open while no
	// lock is watched.
	probeIdle = 30 * time.Second
)

// probeSQL lists which of the given backends still hold which advisory
// locks in this database. $1: the backends' process ids.
const probeSQL = `
SELECT pid, classid::bigint, objid::bigint FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = ANY($1)
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// sessionProber looks, from a connection of its own, at the server's lock
// table for the sessions of the watched locks, and reports each lock whose
// session no longer holds it. It hears what the socket watch cannot: a
// half-open connection, whose server side was reset (the server ended the
// session and freed the lock) while the client side stays open and silent.
// One statement covers every watched lock of the Locker. It runs only while
// a lock is watched (its connection is closed after probeIdle without
// one), and reports a loss only when the look-up succeeded on the server
// the lock was taken on: a failed look-up says nothing.
type sessionProber struct {
	l    *advisoryLocker
	cfg  *pgx.ConnConfig
	kick chan struct{} // a watch was added
	stop context.CancelFunc
	done chan struct{}
	conn *pgx.Conn // used by the loop only
}

// probeKey names a lock in pg_locks: the backend and the key's halves.
type probeKey struct {
	pid            int32
	classid, objid int64
}

// key is h's entry in pg_locks.
func (h *hold) probeKey() probeKey {
	return probeKey{pid: int32(h.pid), classid: int64(uint32(uint64(h.adv) >> 32)), objid: int64(uint32(uint64(h.adv)))}
}

func newSessionProber(l *advisoryLocker) *sessionProber {
	ctx, cancel := context.WithCancel(l.ctx)
	p := &sessionProber{l: l, cfg: l.pool.Config().ConnConfig, kick: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go p.loop(ctx)
	return p
}

// wake tells the loop a watch was added.
func (p *sessionProber) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// close stops the loop and closes its connection.
func (p *sessionProber) close() {
	p.stop()
	<-p.done
}

func (p *sessionProber) loop(ctx context.Context) {
	defer close(p.done)
	defer p.drop()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		holds := p.l.watchedHolds()
		if len(holds) == 0 {
			if !p.idle(ctx) {
				return
			}
			continue
		}
		p.probe(ctx, holds)
		t.Reset(probeInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

// idle waits for a watch to be added, closing the connection after
// probeIdle; it reports whether ctx is still live.
func (p *sessionProber) idle(ctx context.Context) bool {
	t := time.NewTimer(probeIdle)
	defer t.Stop()
	for {
		select {
		case <-p.kick:
			return true
		case <-t.C:
			p.drop()
		case <-ctx.Done():
			return false
		}
	}
}

// probe looks holds up once, and reports those whose session no longer
// holds their lock on the server the probe reached.
func (p *sessionProber) probe(ctx context.Context, holds []*hold) {
	present, server, err := p.lookup(ctx, holds)
	if err != nil {
		// The connection may be half-open itself, or have been made
		// while the path was failing: look again at once on a new one.
		p.drop()
		if ctx.Err() != nil {
			return
		}
		if present, server, err = p.lookup(ctx, holds); err != nil {
			p.drop()
			return
		}
	}
	for _, h := range holds {
		if h.server == server && !present[h.probeKey()] {
			p.l.sessionGone(h, errors.New("the server no longer has the session (found by the session probe)"))
		}
	}
}

// lookup runs probeSQL for holds' backends, connecting first if needed. It
// returns the locks found and the address of the server it asked.
func (p *sessionProber) lookup(ctx context.Context, holds []*hold) (map[probeKey]bool, string, error) {
	if p.conn == nil {
		cctx, cancel := context.WithTimeout(ctx, probeConnectTimeout)
		conn, err := pgx.ConnectConfig(cctx, p.cfg)
		cancel()
		if err != nil {
			return nil, "", err
		}
		p.conn = conn
	}
	pids := make([]int32, 0, len(holds))
	seen := map[int32]bool{}
	for _, h := range holds {
		if k := h.probeKey(); !seen[k.pid] {
			seen[k.pid] = true
			pids = append(pids, k.pid)
		}
	}
	qctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	rows, err := p.conn.Query(qctx, probeSQL, pids)
	if err != nil {
		return nil, "", err
	}
	present := map[probeKey]bool{}
	var k probeKey
	_, err = pgx.ForEachRow(rows, []any{&k.pid, &k.classid, &k.objid}, func() error {
		present[k] = true
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return present, p.conn.PgConn().Conn().RemoteAddr().String(), nil
}

// drop closes the probe's connection, if any.
func (p *sessionProber) drop() {
	if p.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	_ = p.conn.Close(ctx)
	p.conn = nil
}

// watchedHolds returns the holds with a live watch.
func (l *advisoryLocker) watchedHolds() []*hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	var hs []*hold
	for _, s := range l.slots {
		if h := s.cur; h != nil && h.listeners != nil && !h.gone {
			hs = append(hs, h)
		}
	}
	return hs
}
