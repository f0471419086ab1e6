package rediscore

import (
	"crypto/sha1"
	"encoding/hex"
	"strings"
)

// Script is a Lua script with its SHA1 (computed at init), run by EVALSHA
// with a fallback to EVAL when the server answers NOSCRIPT.
type Script struct {
	// Name is a short human-readable name used in error messages.
	Name string
	// Src is the Lua source.
	Src string
	// SHA is the hex SHA1 of Src, as SCRIPT LOAD would return it.
	SHA string
}

func newScript(name, src string) *Script {
	sum := sha1.Sum([]byte(src))
	return &Script{Name: name, Src: src, SHA: hex.EncodeToString(sum[:])}
}

// The value stored at a lock key is "<token>:<owner>": the decimal fencing
// token, a colon, then the owner string. Tokens never contain a colon, so
// the first colon splits the value even when the owner contains colons.

// AcquireScript takes a lock and mints its fencing token in one round trip.
//
//	KEYS[1] lock key, KEYS[2] token counter key (same hash slot)
//	ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] counter retention in ms
//
// Reply: a bulk string holding the decimal token when this call made a new
// grant; a one-element array {token} when owner already held the lock (the
// PX is reset and the same token comes back: the call created nothing); or
// an integer, the holder's PTTL in ms, when another owner holds it (or it
// is reserved for a queued waiter, see ReleaseScript). The two
// grant shapes let a caller that gave up mid-call clean up only a grant it
// created (see CleanupScript).
//
// The token is max(counter+1, server TIME in microseconds). The counter is
// written with PX = ttl + retention, so counters of idle keys disappear; the
// TIME floor keeps tokens increasing after the counter expired or the server
// restarted empty, provided the server clock never steps back by more than
// the retention.
var AcquireScript = newScript("acquire", grantLua+`
local v = redis.call('GET', KEYS[1])
if v then
  local i = string.find(v, ':', 1, true)
  if i and string.sub(v, i + 1) == ARGV[1] and string.sub(v, 1, 2) ~= 'q:' then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {string.sub(v, 1, i - 1)}
  end
  return redis.call('PTTL', KEYS[1])
end
local t = redis.call('TIME')
return grant(t)
`)

// grantLua mints the fencing token and writes the grant, for
// AcquireScript and QueueAcquireScript: grant(t), given the reply t of
// TIME, sets the counter to max(counter+1, t in µs) with PX ttl +
// retention, stores "<token>:<owner>" at the lock key with PX ttl, and
// returns the token as a string.
//
//	KEYS[1] lock key, KEYS[2] token counter key
//	ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] counter retention in ms
const grantLua = `
local function grant(t)
  local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if c + 1 > n then n = c + 1 end
  local s = string.format('%.0f', n)
  redis.call('SET', KEYS[2], s, 'PX', tonumber(ARGV[2]) + tonumber(ARGV[3]))
  redis.call('SET', KEYS[1], s .. ':' .. ARGV[1], 'PX', ARGV[2])
  return s
end
`

// RefreshScript resets the TTL of a lock its owner holds. It never revives
// an expired key: an absent key is simply not held. A refresh to a shorter
// TTL than the key had left (a release under a minimum hold, or a manual
// Refresh) tells the waiters at once, since the key may now become free
// sooner than they were told: the first waiter of the fair queue gets a
// nudge with the new TTL (see reserveLua), and the key's channel a
// message, so that barging waiters look again and learn the new TTL.
//
//	KEYS[1] lock key, KEYS[2] queue list
//	ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] the key's channel,
//	ARGV[4] wake channel prefix
//
// Reply: 1 when refreshed, 0 when owner does not hold the lock.
var RefreshScript = newScript("refresh", reserveLua+`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 2) ~= 'q:' then
  local i = string.find(v, ':', 1, true)
  if i and string.sub(v, i + 1) == ARGV[1] then
    local before = redis.call('PTTL', KEYS[1])
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    if before > tonumber(ARGV[2]) then
      nudge(KEYS[2], ARGV[4], ARGV[2])
      redis.call('PUBLISH', ARGV[3], '1')
    end
    return 1
  end
end
return 0
`)

// AcquireTrackedScript is AcquireScript for a connection that tracks the
// keys it reads with CLIENT TRACKING ... NOLOOP: a write to the lock key
// ends the tracking of it, and NOLOOP sends this connection no
// invalidation for its own write, so each branch that writes the key reads
// it again afterwards, which tracks it anew. Keys, arguments and replies
// are AcquireScript's.
var AcquireTrackedScript = newScript("acquire-tracked", editScript(AcquireScript.Src,
	"redis.call('PEXPIRE', KEYS[1], ARGV[2])\n", "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n    redis.call('GET', KEYS[1])\n",
	"return grant(t)\n", "local s = grant(t)\nredis.call('GET', KEYS[1])\nreturn s\n"))

// RefreshTrackedScript is RefreshScript for a tracking connection with
// NOLOOP, as AcquireTrackedScript: after its PEXPIRE it reads the lock key
// again, so the key stays tracked, and it replies 2 (not 1) when it
// shortened the key's TTL, so that the caller can tell the waiters of its
// own process, to whom NOLOOP sends nothing. Keys and arguments are
// RefreshScript's.
var RefreshTrackedScript = newScript("refresh-tracked", editScript(RefreshScript.Src,
	"redis.call('PEXPIRE', KEYS[1], ARGV[2])\n", "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n    redis.call('GET', KEYS[1])\n",
	"redis.call('PUBLISH', ARGV[3], '1')\n", "redis.call('PUBLISH', ARGV[3], '1')\n      return 2\n"))

// editScript returns src with each edit (pairs of old, new text) made;
// each old text must occur exactly once, so that a script edited out of
// shape fails at init, not at run time.
func editScript(src string, edits ...string) string {
	for i := 0; i+1 < len(edits); i += 2 {
		if strings.Count(src, edits[i]) != 1 {
			panic("rediscore: editScript: not found exactly once: " + edits[i])
		}
		src = strings.Replace(src, edits[i], edits[i+1], 1)
	}
	return src
}

// reserveLua hands a free lock to the first live waiter of its fair queue:
// reserve(now, h, l, z, wake, self), given server time now in ms, the
// first element h of the list l (expiries in the sorted set z), the wake
// channel prefix and the caller's own element (or nil), walks the queue
// from its head. An entry past its expiry is dropped. So is an entry whose
// Node no longer listens: the lock key is published on the entry's wake
// channel, and PUBLISH reaching no subscriber means the waiter's process
// exited or lost its connection. That check is skipped for elements that
// start with "~" (the waiter's Node was not subscribed when it joined, or
// runs on a Cluster, where PUBLISH counts only the subscribers of the node
// that runs the script). The first entry that passes gets the lock key set
// to the reservation "q:<element>" for the rest of its entry's life.
//
// Reply: "other" and the reservation's life in ms when reserved, "self"
// when the walk reached the caller's own element (nothing is reserved:
// the caller takes the lock), nil when nobody live is left.
//
// millis(t) is the reply t of TIME in milliseconds.
//
// nudge(l, wake, ms) tells the first waiter of the list l, which became
// first without being woken (the one before it was granted the lock or
// left) or whose holder shortened its TTL, that the lock is held for ms
// more: the message "{<ms>}<lock>" on its wake channel sets its next look
// to then, with no round trip, so that it notices at once a holder that
// stops renewing. A wake-up is the lock key alone. The two cannot be
// confused whatever bytes the key and the prefix hold: a lock key starts
// with the prefix, which is never empty and has no brace, and ms, digits
// only, ends at the first '}'.
const reserveLua = `
local function millis(t)
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- wid(h) is the Node id of the element h ("<wid>:<owner>" or
-- "~<wid>:<owner>"): hex, so the first colon ends it, whatever the owner
-- holds.
local function wid(h)
  local w = string.sub(h, 1, string.find(h, ':', 1, true) - 1)
  if string.sub(w, 1, 1) == '~' then return string.sub(w, 2), false end
  return w, true
end

local function reserve(now, h, l, z, wake, self)
  while h do
    if h == self then return 'self', 0 end
    local e = tonumber(redis.call('ZSCORE', z, h))
    if e and e > now then
      local w, sure = wid(h)
      if redis.call('PUBLISH', wake .. w, KEYS[1]) > 0 or not sure then
        redis.call('SET', KEYS[1], 'q:' .. h, 'PX', e - now)
        return 'other', e - now
      end
    end
    redis.call('LPOP', l)
    redis.call('ZREM', z, h)
    h = redis.call('LINDEX', l, 0)
  end
  return nil, 0
end

local function nudge(l, wake, ms)
  local h = redis.call('LINDEX', l, 0)
  if h then
    redis.call('PUBLISH', wake .. wid(h), '{' .. ms .. '}' .. KEYS[1])
  end
end
`

// handoffLua ends a grant: it hands the lock to the first live waiter of
// the key's fair queue (see reserveLua), or deletes it when nobody waits
// and publishes on the key's channel, waking barging and pub/sub waiters.
//
//	KEYS[1] lock key, KEYS[2] queue list, KEYS[3] queue expiries
//	ARGV[2] the key's channel, ARGV[3] wake channel prefix
const handoffLua = reserveLua + `
local function handoff()
  local h = redis.call('LINDEX', KEYS[2], 0)
  if h then
    if reserve(millis(redis.call('TIME')), h, KEYS[2], KEYS[3], ARGV[3], nil) then return end
  end
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
end
`

// ReleaseScript frees a lock its owner holds: it hands it to the first
// live waiter of the key's fair queue, or deletes it and publishes on the
// key's channel, waking pub/sub waiters (clients using client-side caching
// are woken by the DEL's invalidation). With nobody queued it costs one
// LINDEX more than a compare-and-delete.
//
//	KEYS[1] lock key, KEYS[2] queue list, KEYS[3] queue expiries
//	ARGV[1] owner, ARGV[2] the key's channel, ARGV[3] wake channel prefix
//
// Reply: 1 when released, 0 when owner does not hold the lock.
var ReleaseScript = newScript("release", handoffLua+`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 2) ~= 'q:' then
  local i = string.find(v, ':', 1, true)
  if i and string.sub(v, i + 1) == ARGV[1] then
    handoff()
    return 1
  end
end
return 0
`)

// CleanupScript frees a grant that an abandoned Acquire created, as
// ReleaseScript does, but only while the key still holds exactly that
// grant (owner and one of the given tokens), so a lock owner held before
// the attempt, or took again since, is never freed.
//
//	KEYS[1] lock key, KEYS[2] queue list, KEYS[3] queue expiries
//	ARGV[1] owner, ARGV[2] the key's channel, ARGV[3] wake channel prefix,
//	ARGV[4..] candidate tokens (decimal)
//
// Reply: 1 when freed, 0 otherwise.
var CleanupScript = newScript("cleanup", handoffLua+`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
for i = 4, #ARGV do
  if v == ARGV[i] .. ':' .. ARGV[1] then
    handoff()
    return 1
  end
end
return 0
`)

// InspectScript reads a lock in one round trip.
//
//	KEYS[1] lock key
//
// Reply: nil when the key is free, else an array {owner, token, pttl}
// (owner and token as bulk strings, pttl as an integer in ms).
var InspectScript = newScript("inspect", `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 2) == 'q:' then return nil end
local i = string.find(v, ':', 1, true)
if not i then return {v, '0', redis.call('PTTL', KEYS[1])} end
return {string.sub(v, i + 1), string.sub(v, 1, i - 1), redis.call('PTTL', KEYS[1])}
`)

// FenceScript is the Redlock write-back (an addition to the core API): on a
// node where owner still holds the lock, it rewrites the stored token to the
// grant's token (keeping the TTL) and raises the counter to at least it.
//
//	KEYS[1] lock key, KEYS[2] token counter key
//	ARGV[1] owner, ARGV[2] token (decimal), ARGV[3] counter PX in ms
//
// Reply: 1 when written, 0 when owner no longer holds the lock there.
var FenceScript = newScript("fence", `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local i = string.find(v, ':', 1, true)
if not i or string.sub(v, i + 1) ~= ARGV[1] or string.sub(v, 1, 2) == 'q:' then return 0 end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  redis.call('SET', KEYS[1], ARGV[2] .. ':' .. ARGV[1], 'PX', pttl)
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if c < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
end
return 1
`)
