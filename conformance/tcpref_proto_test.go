package conformance_test

// The TCP reference driver's wire protocol, shared by its server
// (tcpref_server_test.go) and its client (tcpref_driver_test.go).
//
// Every message is a frame: a 4-byte big-endian length, then that many
// bytes of fields, each a 4-byte big-endian length and its bytes. Keys and
// owners travel as fields of their own, so any bytes (a newline, a NUL, a
// separator) are carried as they are and never split on.
//
// A request is [id, op, args...]; its reply is [id, status, values...],
// with the same id (8 bytes, never 0). The server answers the requests of
// one connection in the order they arrive, so a client that pipelines
// requests on one connection sees them applied in that order. A push is
// [0, "WAKE", subscription id]. Numbers are 8-byte big-endian; durations
// are nanoseconds.
//
//	ACQ key owner ttl   → OK token | HELD remaining
//	REF key owner ttl   → OK | NOTHELD
//	REL key owner       → OK | NOTHELD
//	INS key             → OK owner token remaining | NOTHELD
//	SUB sid key         → OK (then WAKE pushes on each release of key)
//	UNSUB sid           → OK
//	PING                → OK
//	PUT key owner ttl   → OK token (an unconditional grant; only the
//	                      reset-reasserts flaw sends it)
//	anything malformed  → ERR message (INVALID message for a bad argument)

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// maxFrame bounds a frame, so that a corrupt length cannot make a peer
// allocate without limit.
const maxFrame = 1 << 20

// writeFrame writes fields as one frame, in one Write.
func writeFrame(w io.Writer, fields ...[]byte) error {
	n := 0
	for _, f := range fields {
		n += 4 + len(f)
	}
	if n > maxFrame {
		return fmt.Errorf("tcpref: frame of %d bytes exceeds %d", n, maxFrame)
	}
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+n), uint32(n))
	for _, f := range fields {
		b = binary.BigEndian.AppendUint32(b, uint32(len(f)))
		b = append(b, f...)
	}
	_, err := w.Write(b)
	return err
}

// readFrame reads one frame and returns its fields.
func readFrame(r *bufio.Reader) ([][]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("tcpref: frame of %d bytes exceeds %d", n, maxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	var fields [][]byte
	for len(body) > 0 {
		if len(body) < 4 {
			return nil, errors.New("tcpref: truncated field length")
		}
		m := binary.BigEndian.Uint32(body)
		body = body[4:]
		if uint32(len(body)) < m {
			return nil, errors.New("tcpref: truncated field")
		}
		fields = append(fields, body[:m:m])
		body = body[m:]
	}
	return fields, nil
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func dur(d time.Duration) []byte { return u64(uint64(d)) }

// num decodes an 8-byte number; ok is false for a field of another size.
func num(b []byte) (v uint64, ok bool) {
	if len(b) != 8 {
		return 0, false
	}
	return binary.BigEndian.Uint64(b), true
}
