package conformance_test

import (
	"time"
)

// do applies one request (see tcpref_proto_test.go) and returns the reply,
// and the subscriptions a release must wake.
func (s *tcpServer) do(sc *srvConn, req [][]byte) (reply [][]byte, wake []subRef) {
	if len(req) < 2 {
		return [][]byte{u64(0), []byte("ERR"), []byte("a request needs an id and an op")}, nil
	}
	id, op, args := req[0], string(req[1]), req[2:]
	ok := func(status string, vals ...[]byte) { reply = append([][]byte{id, []byte(status)}, vals...) }
	ok("ERR", []byte("unknown op or bad arguments: "+op))
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	switch {
	case op == "PING" && len(args) == 0:
		ok("OK")
	case op == "ACQ" || op == "REF" || op == "PUT":
		key, owner, ttl, valid := leaseArgs(args)
		if !valid {
			ok("INVALID", []byte(op+": want a non-empty key, an owner and a positive ttl"))
			return reply, nil
		}
		l := s.live(now, key)
		switch {
		case op == "PUT" || (op == "ACQ" && l == nil):
			s.counter++
			s.leases[key] = &srvLease{owner: owner, token: s.counter, expires: now.Add(ttl)}
			ok("OK", u64(s.counter))
		case op == "REF" && (l == nil || l.owner != owner):
			ok("NOTHELD")
		case l.owner != owner:
			ok("HELD", dur(l.expires.Sub(now)))
		default: // the holder's Acquire or Refresh: a new ttl from now, same token
			l.expires = now.Add(ttl)
			ok("OK", u64(l.token))
		}
	case op == "REL" && len(args) == 2 && len(args[0]) > 0:
		key := string(args[0])
		if l := s.live(now, key); l == nil || l.owner != string(args[1]) {
			ok("NOTHELD")
			return reply, nil
		}
		delete(s.leases, key)
		ok("OK")
		for ref := range s.subs[key] {
			wake = append(wake, ref)
		}
	case op == "INS" && len(args) == 1 && len(args[0]) > 0:
		status, vals := s.inspect(now, string(args[0]))
		ok(status, vals...)
	case op == "SUB" && len(args) == 2:
		if sid, good := num(args[0]); good && now.After(s.subsFrom) {
			key := string(args[1])
			sc.sids[sid] = key
			if s.subs[key] == nil {
				s.subs[key] = map[subRef]struct{}{}
			}
			s.subs[key][subRef{sc, sid}] = struct{}{}
		}
		ok("OK")
	case op == "UNSUB" && len(args) == 1:
		if sid, good := num(args[0]); good {
			delete(s.subs[sc.sids[sid]], subRef{sc, sid})
			delete(sc.sids, sid)
		}
		ok("OK")
	}
	return reply, wake
}

// inspect returns the status and values of an INS reply. s.mu is held.
func (s *tcpServer) inspect(now time.Time, key string) (string, [][]byte) {
	l := s.live(now, key)
	if g := s.ghosts[key]; l == nil && g != nil && now.Before(g.expires) {
		l = g // tcp-inspect-ghost-after-empty-restart
	}
	if l == nil {
		return "NOTHELD", nil
	}
	return "OK", [][]byte{[]byte(l.owner), u64(l.token), dur(l.expires.Sub(now))}
}

// leaseArgs parses the arguments key, owner, ttl.
func leaseArgs(args [][]byte) (key, owner string, ttl time.Duration, ok bool) {
	if len(args) != 3 || len(args[0]) == 0 {
		return "", "", 0, false
	}
	n, ok := num(args[2])
	if !ok || int64(n) <= 0 {
		return "", "", 0, false
	}
	return string(args[0]), string(args[1]), time.Duration(n), true
}

// live returns key's lease if it has not expired, and forgets it if it has.
// s.mu is held.
func (s *tcpServer) live(now time.Time, key string) *srvLease {
	l := s.leases[key]
	if l != nil && !now.Before(l.expires) {
		delete(s.leases, key)
		return nil
	}
	return l
}
