package rediscore

// The scripts of shared holds (shared.go): one per operation, each on the
// seven keys of one lock (SharedKeys), all under the key's hash tag:
//
//	KEYS[1] Z   holders: a sorted set of owners, scored by the server time
//	            (ms) at which each one's lease ends
//	KEYS[2] D   holders' data: a hash, owner -> "<token>:<mode>" (s, r or w:
//	            semaphore, read, write)
//	KEYS[3] C   the token counter, the mutex's (Keys)
//	KEYS[4] Q   waiters in arrival order: a list of "<wid>:<owner>" (or
//	            "~<wid>:<owner>", see the fair queue in queue.go)
//	KEYS[5] QT  the waiters' entry expiries (sorted set, ms)
//	KEYS[6] QA  what each waiter asks for: a hash, element ->
//	            "<mode><limit>:<ttl ms>"
//	KEYS[7] QG  grants made to waiters and not yet collected: a hash,
//	            element -> token
//
// Every script reads TIME once, drops the holders whose lease ended
// (prune) and grants the queue from its head for as long as the head fits
// (settle), so an expiry is acted on by the next script that touches the
// lock, whoever runs it.
const sharedLua = `
local Z, D, C, Q, QT, QA, QG = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- prune drops the holders whose lease ended: as Redis expires a key, a
-- lease scored at ms s ends once now > s.
local function prune()
  local gone = redis.call('ZRANGEBYSCORE', Z, '-inf', '(' .. now)
  for _, o in ipairs(gone) do redis.call('HDEL', D, o) end
  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', Z, '-inf', '(' .. now) end
end

-- hold(o) is o's hold: its token and mode, or nil.
local function hold(o)
  local v = redis.call('HGET', D, o)
  if not v then return nil end
  return string.sub(v, 1, -3), string.sub(v, -1)
end

-- count is the number of holders when fits last looked (nil before).
local count

-- fits(mode, limit): may a new holder in mode join the holders?
local function fits(mode, limit)
  local n = redis.call('ZCARD', Z)
  count = n
  if n == 0 then return true end
  if mode == 's' then return n < limit end
  if mode == 'w' then return false end
  if n > 1 then return true end
  local _, m = hold(redis.call('ZRANGE', Z, 0, 0)[1])
  return m ~= 'w'
end

-- earliest is the time in ms until the first lease ends (see prune), 0
-- without holders.
local function earliest()
  local f = redis.call('ZRANGE', Z, 0, 0, 'WITHSCORES')
  if #f == 0 then return 0 end
  return tonumber(f[2]) + 1 - now
end

-- extend makes the holder keys live at least ms more, for a lease of ms
-- just set: at once when fits saw no holder (the keys are new), else if
-- they would end sooner. They are never shortened: an ended lease is
-- recognised by its score, not by its keys' life.
local function extend(ms)
  if count ~= 0 and redis.call('PTTL', Z) >= ms then return end
  redis.call('PEXPIRE', Z, ms)
  redis.call('PEXPIRE', D, ms)
end

-- grant makes o a holder in mode for ttl ms with a fresh token:
-- max(counter+1, TIME in us), as the mutex's (grantLua).
local function grant(o, mode, ttl, ret)
  local n = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local c = tonumber(redis.call('GET', C) or '0') or 0
  if c + 1 > n then n = c + 1 end
  local s = string.format('%.0f', n)
  redis.call('SET', C, s, 'PX', ttl + tonumber(ret))
  redis.call('ZADD', Z, now + ttl, o)
  redis.call('HSET', D, o, s .. ':' .. mode)
  extend(ttl)
  count = count and count + 1
  return s
end

local function owner(el) return string.sub(el, string.find(el, ':', 1, true) + 1) end

-- tell publishes msg on the wake channel of el's Node; false when nobody
-- listens there and the element says somebody should (see reserveLua).
local function tell(el, wake, msg)
  local w = string.sub(el, 1, string.find(el, ':', 1, true) - 1)
  local sure = string.sub(w, 1, 1) ~= '~'
  if not sure then w = string.sub(w, 2) end
  return redis.call('PUBLISH', wake .. w, msg) > 0 or not sure
end

local function unqueue(el)
  redis.call('LREM', Q, 1, el)
  redis.call('ZREM', QT, el)
  redis.call('HDEL', QA, el)
end

-- settle grants the queue from its head while the head fits: a run of
-- readers, one writer, or permits while slots last. Each waiter granted
-- is told on its wake channel (not self, the caller's own element); the
-- grant waits in QG for its next attempt. Lapsed entries are dropped, and
-- entries whose Node no longer listens, ungranted. A waiter whose owner
-- holds the lock already leaves the queue and is told (its attempt
-- returns that hold, or ErrInvalid for the other mode). A waiter left
-- first by this walk is nudged with the time until the first lease ends.
-- It returns the element now first, or nil.
local function settle(ret, wake, self)
  local moved = false
  local h = redis.call('LINDEX', Q, 0)
  while h do
    local e = tonumber(redis.call('ZSCORE', QT, h))
    local a = redis.call('HGET', QA, h)
    if e and e > now and a then
      local o = owner(h)
      local holds = redis.call('HEXISTS', D, o) == 1
      local j = string.find(a, ':', 2, true)
      local mode = string.sub(a, 1, 1)
      if not holds and not fits(mode, tonumber(string.sub(a, 2, j - 1))) then break end
      if (h == self or tell(h, wake, Z)) and not holds then
        local ttl = tonumber(string.sub(a, j + 1))
        redis.call('HSET', QG, h, grant(o, mode, ttl, ret))
        redis.call('PEXPIRE', QG, math.max(ttl, redis.call('PTTL', QG)))
      end
    end
    unqueue(h)
    moved = true
    h = redis.call('LINDEX', Q, 0)
  end
  if moved and h and h ~= self then
    tell(h, wake, '{' .. earliest() .. '}' .. Z)
  end
  return h
end
`

// SharedAcquireScript is one attempt at a shared hold: the owner's own
// hold again (same mode: ttl reset, same token), a grant collected from
// the queue, or a new grant when nobody queues ahead and the request fits;
// otherwise, when joining, the waiter is queued (or its entry renewed).
//
//	ARGV[1] owner, ARGV[2] ttl in ms, ARGV[3] counter retention in ms,
//	ARGV[4] element ("" for a one-shot attempt), ARGV[5] QueueTTL in ms,
//	ARGV[6] wake channel prefix,
//	ARGV[7] "1" to join the queue, ARGV[8] mode (s, r or w),
//	ARGV[9] limit (permits)
//
// Reply, in the shapes of AcquireScript's: a bulk string token for a grant
// this call (or the queue, for this waiter) made; {token} when the owner
// held it already; {"mode", m} when the owner holds the read-write lock in
// the other mode m; otherwise an integer: ms until the first lease ends
// (0 when only the queue is in the way), or, for a queued waiter that is
// not first, the first entry's remaining life.
var SharedAcquireScript = newScript("shared-acquire", sharedLua+`
prune()
local o, ttl, el, mode = ARGV[1], tonumber(ARGV[2]), ARGV[4], ARGV[8]
-- A one-shot attempt has no element (""): it is in no queue.
-- Only a queued waiter (one that joins) can have a grant waiting in QG.
local queued = ARGV[7] == '1'
local mine
if queued then
  mine = redis.call('HGET', QG, el)
  if mine then redis.call('HDEL', QG, el) end
end
local tok, m = hold(o)
if tok then
  if el ~= '' then unqueue(el) end
  settle(ARGV[3], ARGV[6], el)
  if m ~= mode then return {'mode', m} end
  redis.call('ZADD', Z, now + ttl, o)
  extend(ttl)
  if mine == tok then return tok end
  return {tok}
end
local first = settle(ARGV[3], ARGV[6], el)
if queued then
  mine = redis.call('HGET', QG, el)
  if mine then
    redis.call('HDEL', QG, el)
    return mine
  end
end
if not first and fits(mode, tonumber(ARGV[9])) then
  return grant(o, mode, ttl, ARGV[3])
end
if not queued then return earliest() end
local life = tonumber(ARGV[5])
if redis.call('ZADD', QT, now + life, el) == 1 then
  redis.call('RPUSH', Q, el)
end
redis.call('HSET', QA, el, mode .. ARGV[9] .. ':' .. ttl)
for _, k in ipairs({Q, QT, QA}) do redis.call('PEXPIRE', k, 2 * life) end
if not first or first == el then return earliest() end
return tonumber(redis.call('ZSCORE', QT, first)) - now
`)

// SharedRefreshScript resets the ttl of the owner's live hold in mode; it
// never revives an ended lease. A refresh to a shorter ttl nudges the first
// waiter with the new time until the first lease ends.
//
//	ARGV[1] owner, ARGV[2] mode, ARGV[3] ttl in ms, ARGV[4] wake channel
//	prefix
//
// Reply: 1 when refreshed, 0 when the owner holds no such hold.
var SharedRefreshScript = newScript("shared-refresh", sharedLua+`
prune()
local tok, m = hold(ARGV[1])
if not tok or m ~= ARGV[2] then return 0 end
local at = now + tonumber(ARGV[3])
local before = tonumber(redis.call('ZSCORE', Z, ARGV[1]))
redis.call('ZADD', Z, at, ARGV[1])
extend(tonumber(ARGV[3]))
local h = redis.call('LINDEX', Q, 0)
if h and at < before then tell(h, ARGV[4], '{' .. earliest() .. '}' .. Z) end
return 1
`)

// SharedReleaseScript ends the owner's hold in mode and grants the queue
// from its head as far as it now fits.
//
//	ARGV[1] owner, ARGV[2] mode, ARGV[3] counter retention in ms,
//	ARGV[4] wake channel prefix
//
// Reply: 1 when released, 0 when the owner holds no such hold.
var SharedReleaseScript = newScript("shared-release", sharedLua+`
prune()
local tok, m = hold(ARGV[1])
if not tok or m ~= ARGV[2] then return 0 end
redis.call('ZREM', Z, ARGV[1])
redis.call('HDEL', D, ARGV[1])
settle(ARGV[3], ARGV[4], nil)
return 1
`)

// SharedLeaveScript takes a waiter out of the queue (its wait ended) and
// frees a grant made for it: one the queue made and it never collected,
// or the one with token ARGV[4] that an abandoned attempt created. It then
// grants the queue from its head (a writer leaving the head may let
// readers in).
//
//	ARGV[1] element, ARGV[2] counter retention in ms, ARGV[3] wake channel
//	prefix, ARGV[4] token to free ("" for none)
//
// Reply: 1 when a grant was freed, else 0.
var SharedLeaveScript = newScript("shared-leave", sharedLua+`
prune()
local el = ARGV[1]
unqueue(el)
local g = redis.call('HGET', QG, el)
redis.call('HDEL', QG, el)
local o = owner(el)
local tok = hold(o)
local freed = 0
if tok and (tok == g or tok == ARGV[4]) then
  redis.call('ZREM', Z, o)
  redis.call('HDEL', D, o)
  freed = 1
end
settle(ARGV[2], ARGV[3], nil)
return freed
`)

// SharedInspectScript lists the live holders. It changes nothing.
//
// Reply: a flat array owner, "<token>:<mode>", ms left, ... (any order).
var SharedInspectScript = newScript("shared-inspect", sharedLua+`
local live = redis.call('ZRANGEBYSCORE', Z, now, '+inf', 'WITHSCORES')
local out = {}
for i = 1, #live, 2 do
  local v = redis.call('HGET', D, live[i])
  if v then
    out[#out + 1] = live[i]
    out[#out + 1] = v
    out[#out + 1] = tonumber(live[i + 1]) - now
  end
end
return out
`)
