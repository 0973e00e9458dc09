-- idem leases: the part every lease_*.lua script starts with (prepended in Rust).
-- KEYS[1] lease state   KEYS[2] event list   KEYS[3] legacy lease hash
-- KEYS[4] legacy token counter (all four share one hash tag)
-- ARGV[1] clock shift (ms)   ARGV[2] grace (ms)   ARGV[3] events kept
-- The state string: "<token> <acquired_at> <expires_at> <renewals> <L|E> <owner>".
-- L: granted, live until expires_at by the store clock (after that, expired but not yet
-- recorded); E: ended (released, recorded as expired, or force-released). The key
-- outlives the lease, so its token is the name's counter.
-- Numbers stay below 2^53, exact in Lua's doubles; they are written with '%d' (never
-- tostring, which rounds to 14 digits) and tokens are compared as strings. Arguments to
-- redis.call are strings: Redis formats a Lua number with a slow '%.17g'.
local state_k, events_k = KEYS[1], KEYS[2]
local function int(n) return string.format('%d', n) end
local clock = redis.call('TIME')
local shift = tonumber(ARGV[1])
-- Store time: the Redis server's clock plus the shift, never the caller's clock.
local now = clock[1] * 1000 + math.floor(clock[2] / 1000) + shift
local now_us = clock[1] * 1000000 + clock[2] + shift * 1000
local grace = tonumber(ARGV[2])
local kept = tonumber(ARGV[3])
local keep_from = '-' .. ARGV[3]
-- Legacy keys read into the state; deleted when the state is next written.
local legacy = false
-- Set by push(): the event list's expiry is extended once, in reply().
local pushed = false

-- The lease state (live, expired or ended), or nil. A name last written by an older
-- idem (a hash and a counter) is read from those keys.
local function load()
  local v = redis.call('GET', state_k)
  if v then
    local tok, acq, exp, ren, st, own =
      string.match(v, '^(%d+) (%d+) (%d+) (%d+) ([LE]) (%S+)$')
    if not tok then error('IDEMCORRUPT lease state ' .. state_k) end
    return {token = tok, acquired_at = tonumber(acq), expires_at = tonumber(exp),
            renewals = tonumber(ren), granted = st == 'L', owner = own}
  end
  local f = redis.call('HMGET', KEYS[3], 'owner', 'token', 'acquired_at', 'expires_at',
    'renewals')
  local counter = redis.call('GET', KEYS[4])
  if f[1] then
    if not (f[2] and f[3] and f[4] and f[5]) then
      error('IDEMCORRUPT lease ' .. KEYS[3] .. ' is missing fields')
    end
    legacy = true
    local s = {token = f[2], acquired_at = tonumber(f[3]), expires_at = tonumber(f[4]),
               renewals = tonumber(f[5]), granted = true, owner = f[1]}
    -- The hash's token is the last grant (the old scripts kept the counter equal to it);
    -- a counter ahead of it still raises the next grant while these keys are read.
    s.floor = counter and tonumber(counter) or 0
    return s
  end
  if counter then
    legacy = true
    return {token = counter, acquired_at = 0, expires_at = 0, renewals = 0,
            granted = false, owner = '-'}
  end
  return nil
end

-- Writes the state; it is collected `grace` after the lease's deadline (or after it ended).
local function save(s)
  local ms = grace
  if s.granted then ms = s.expires_at - now + grace end
  redis.call('SET', state_k, s.token .. ' ' .. int(s.acquired_at) .. ' ' .. int(s.expires_at)
    .. ' ' .. int(s.renewals) .. (s.granted and ' L ' or ' E ') .. s.owner, 'PX', int(ms))
  if legacy then
    redis.call('DEL', KEYS[3], KEYS[4])
    legacy = false
  end
end

-- JSON string of an owner (visible ASCII): escaped only when it holds '"' or '\'.
local function quoted(s)
  if string.find(s, '["\\]') then return cjson.encode(s) end
  return '"' .. s .. '"'
end

-- Appends an event as a JSON object: about lease state `s` (owner, token, times) or about
-- a caller presenting `owner` and `token`. The list keeps the last `kept` events.
local function push(kind, s, owner, token, detail)
  local e = '{"kind":"' .. kind .. '","at":' .. int(now)
  if s then owner = s.owner; token = s.token end
  if owner then e = e .. ',"owner":' .. quoted(owner) end
  if token then e = e .. ',"token":' .. token end
  if s then
    e = e .. ',"acquired_at":' .. int(s.acquired_at) .. ',"expires_at":' .. int(s.expires_at)
  end
  if detail then e = e .. ',"detail":' .. cjson.encode(detail) end
  local n = redis.call('RPUSH', events_k, e .. '}')
  if n > kept then redis.call('LTRIM', events_k, keep_from, '-1') end
  pushed = true
end

-- The live lease; an expired one is recorded as 'expired' and ended (recorded once).
local function settle(s)
  if s and s.granted and s.expires_at <= now then
    push('expired', s)
    s.granted = false
    save(s)
    return nil
  end
  if s and s.granted then return s end
  return nil
end

local function holds(s, owner, token)
  return s and s.granted and s.expires_at > now and s.owner == owner and s.token == token
end

-- idem_core::lease::holder_detail, spelled the same way.
local function holder_detail(s)
  if s then
    return 'held by ' .. s.owner .. ' with token ' .. s.token .. ' until ' .. int(s.expires_at)
  end
  return 'no live lease'
end

-- Reply: {code, now} or {code, now, owner, token, acquired_at, expires_at, renewals}.
-- The event list lives `grace` after its last event and never less than the state.
local function reply(code, s)
  if pushed then
    local ms = grace
    if s and s.granted and s.expires_at > now then ms = s.expires_at - now + grace end
    redis.call('PEXPIRE', events_k, int(ms))
  end
  if s then
    return {code, now, s.owner, s.token, s.acquired_at, s.expires_at, s.renewals}
  end
  return {code, now}
end
