package rediscore

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// DefaultPrefix is the key prefix used when Options.Prefix is empty.
const DefaultPrefix = "locker"

// Keys returns the lock key, the token counter key and the pub/sub channel
// for a user key.
//
// For a key without braces they are "<prefix>:{<key>}",
// "<prefix>:{<key>}:token" and "<prefix>:{<key>}" (channels live in their
// own namespace, so the channel reuses the lock key's name). The hash tag
// puts the lock and its counter in the same Cluster slot. A key containing
// '{' or '}' would break the tag, so its tag is the hex SHA1 of the key
// instead: "<prefix>:{<sha1>}:<key>" and "<prefix>:{<sha1>}:<key>:token".
// The mapping is injective: distinct keys never share a lock or counter.
//
// prefix defaults to DefaultPrefix when empty. It must not contain braces
// (ParseOptions and Options.Validate reject them).
func Keys(prefix, key string) (lock, counter, channel string) {
	lock = LockKey(prefix, key)
	return lock, lock + ":token", lock
}

// LockKey returns the lock key of Keys alone (also its channel), without
// building the counter's name.
func LockKey(prefix, key string) string {
	var buf [128]byte
	return string(appendLockKey(buf[:0], prefix, key))
}

// appendLockKey appends LockKey(prefix, key) to b. Built in a stack buffer,
// it serves map lookups (m[string(b)]) that allocate nothing.
func appendLockKey(b []byte, prefix, key string) []byte {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	b = append(b, prefix...)
	b = append(b, ":{"...)
	if strings.ContainsAny(key, "{}") {
		sum := sha1.Sum([]byte(key))
		b = hex.AppendEncode(b, sum[:])
		b = append(b, "}:"...)
		return append(b, key...)
	}
	b = append(b, key...)
	return append(b, '}')
}
