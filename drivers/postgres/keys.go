package postgres

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"strings"
)

// AdvisoryKey returns the 64-bit PostgreSQL advisory lock key that key maps
// to in namespace: the first 8 bytes, big-endian, of
// SHA-256(namespace || 0x00 || key), as a signed int64. It is stable across
// versions and processes, so any client can compute it (for example to
// look a lock up in pg_locks, where it shows as classid = the high 32 bits,
// objid = the low 32 bits, objsubid = 1). Open and New reject a namespace
// that contains a NUL byte, so distinct namespace and key pairs in use
// always hash distinct inputs.
//
// Two distinct keys collide with probability 2^-64; among n keys in use at
// once the chance that any two collide is about n²/2^65 (one in 37 million
// for a million keys). A collision makes two keys exclude each other; it
// never lets two owners hold the same key.
func AdvisoryKey(namespace, key string) int64 {
	h := sha256.New()
	h.Write([]byte(namespace))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// The holder's session publishes who holds the lock in its application_name
// (visible to everyone in pg_stat_activity) as
//
//	lk/<token in hex>/<ttl in ms, hex>/<owner tag>
//
// application_name holds at most 63 printable ASCII bytes, so the owner tag is
// the owner itself when it is printable ASCII of at most maxOwnerTag bytes,
// and otherwise "#" followed by a hex SHA-256 prefix of it.
const (
	appPrefix   = "lk/"
	maxOwnerTag = 63 - len(appPrefix) - 16 - 1 - 8 - 1
)

// ownerTag returns the form of owner stored in application_name.
func ownerTag(owner string) string {
	if len(owner) <= maxOwnerTag && printable(owner) {
		return owner
	}
	sum := sha256.Sum256([]byte(owner))
	return "#" + hex.EncodeToString(sum[:])[:maxOwnerTag-1]
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// appName returns the application_name of a session holding a lock.
func appName(token uint64, ttlMS int64, tag string) string {
	return appPrefix + strconv.FormatUint(token, 16) + "/" + strconv.FormatInt(ttlMS, 16) + "/" + tag
}

// parseAppName reverses appName.
func parseAppName(s string) (token uint64, ttlMS int64, tag string, ok bool) {
	rest, found := strings.CutPrefix(s, appPrefix)
	if !found {
		return 0, 0, "", false
	}
	tokS, rest, found1 := strings.Cut(rest, "/")
	ttlS, tag, found2 := strings.Cut(rest, "/")
	if !found1 || !found2 {
		return 0, 0, "", false
	}
	token, err1 := strconv.ParseUint(tokS, 16, 64)
	ttlMS, err2 := strconv.ParseInt(ttlS, 16, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return token, ttlMS, tag, true
}
