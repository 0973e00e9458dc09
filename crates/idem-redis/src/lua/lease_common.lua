-- idem leases: the part every lease_*.lua script starts with (prepended in Rust).
-- KEYS[1] lease hash   KEYS[2] token counter   KEYS[3] event list (one hash tag)
-- ARGV[1] clock shift (ms)   ARGV[2] grace (ms)   ARGV[3] events kept
-- Lease hash fields: owner, token, acquired_at, expires_at, renewals (decimal strings).
-- Numbers stay below 2^53, exact in Lua's doubles; they are written with '%d' (never
-- tostring, which rounds to 14 digits) and tokens are compared as strings.
local lease_k, counter_k, events_k = KEYS[1], KEYS[2], KEYS[3]
local function int(n) return string.format('%d', n) end
if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5
local clock = redis.call('TIME')
local shift = tonumber(ARGV[1])
-- Store time: the Redis server's clock plus the shift, never the caller's clock.
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + shift
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2]) + shift * 1000
local grace = tonumber(ARGV[2])
local kept = tonumber(ARGV[3])
-- How long the event list must live after this script; applied once, in flush().
local events_ttl = 0

-- The lease hash (live or expired), or nil.
local function load()
  local f = redis.call('HMGET', lease_k, 'owner', 'token', 'acquired_at', 'expires_at', 'renewals')
  if not f[1] then return nil end
  if not (f[2] and f[3] and f[4] and f[5]) then
    error('IDEMCORRUPT lease ' .. lease_k .. ' is missing fields')
  end
  return {owner = f[1], token = f[2], acquired_at = tonumber(f[3]),
          expires_at = tonumber(f[4]), renewals = tonumber(f[5])}
end

-- Sets a key's expiry to `ms` unless it already lives longer (garbage collection only).
local function keep(k, ms)
  if redis.call('PTTL', k) < ms then redis.call('PEXPIRE', k, ms) end
end

-- Appends an event as a JSON object: about `lease` (owner, token, times) or about a
-- caller presenting `owner` and `token`. The list keeps the last `kept` events.
local function push(kind, lease, owner, token, detail)
  local parts = {'"kind":' .. cjson.encode(kind), '"at":' .. int(now)}
  if lease then owner = lease.owner; token = lease.token end
  if owner then parts[#parts + 1] = '"owner":' .. cjson.encode(owner) end
  if token then parts[#parts + 1] = '"token":' .. token end
  if lease then
    parts[#parts + 1] = '"acquired_at":' .. int(lease.acquired_at)
    parts[#parts + 1] = '"expires_at":' .. int(lease.expires_at)
  end
  if detail then parts[#parts + 1] = '"detail":' .. cjson.encode(detail) end
  local n = redis.call('RPUSH', events_k, '{' .. table.concat(parts, ',') .. '}')
  if n > kept then redis.call('LTRIM', events_k, -kept, -1) end
  if grace > events_ttl then events_ttl = grace end
end

-- Extends the event list's expiry to what this script needs (once per script).
local function flush()
  if events_ttl > 0 then keep(events_k, events_ttl) end
  events_ttl = 0
end

-- The live lease; an expired one is recorded as 'expired' and deleted (recorded once).
local function settle(lease)
  if lease and lease.expires_at <= now then
    push('expired', lease)
    redis.call('DEL', lease_k)
    return nil
  end
  return lease
end

local function holds(lease, owner, token)
  return lease and lease.expires_at > now and lease.owner == owner and lease.token == token
end

-- idem_core::lease::holder_detail, spelled the same way.
local function holder_detail(lease)
  if lease then
    return 'held by ' .. lease.owner .. ' with token ' .. lease.token .. ' until '
      .. int(lease.expires_at)
  end
  return 'no live lease'
end

-- Reply: {code, now} or {code, now, owner, token, acquired_at, expires_at, renewals}.
local function reply(code, lease)
  flush()
  if lease then
    return {code, now, lease.owner, lease.token, int(lease.acquired_at),
            int(lease.expires_at), int(lease.renewals)}
  end
  return {code, now}
end

-- Writes the lease hash. It is collected `grace` after its deadline; the counter and
-- the events live at least as long (`counter_set`: the caller just wrote the counter
-- with that expiry).
local function store(lease, counter_set)
  local ms = lease.expires_at - now + grace
  redis.call('HSET', lease_k, 'owner', lease.owner, 'token', lease.token,
    'acquired_at', int(lease.acquired_at), 'expires_at', int(lease.expires_at),
    'renewals', int(lease.renewals))
  redis.call('PEXPIRE', lease_k, ms)
  if not counter_set then keep(counter_k, ms) end
  if ms > events_ttl then events_ttl = ms end
end

