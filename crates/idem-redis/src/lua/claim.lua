-- idem claim: decides BRIEF §4 / idem_core::decide atomically for one record hash.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] lease (ms)   ARGV[3] retention (ms)
-- ARGV[4] tenant   ARGV[5] key   ARGV[6] principal   ARGV[7] fingerprint (hex)   ARGV[8] owner
-- Replies (all bulk strings):
--   {'proceed', now, kind('fresh'|'retry'|'expired'), previous_owner or '', version, lease_deadline, attempts}
--   {'in_progress', now, owner or '', lease_deadline or ''}
--   {'mismatch', now, state}
--   {'replay', now, <HGETALL of the record>...}
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local deadline = now + lease_ms
local k = KEYS[1]

local cur = redis.call('HMGET', k, 'state', 'version', 'fp', 'principal', 'owner', 'lease', 'attempts')
local state = cur[1]
if not state then
  if redis.call('EXISTS', k) == 1 then
    return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has no state')
  end
  redis.call('HSET', k,
    'tenant', ARGV[4], 'key', ARGV[5], 'principal', ARGV[6], 'fp', ARGV[7],
    'state', 'PROCESSING', 'version', '1', 'owner', ARGV[8], 'lease', fmt(deadline),
    'attempts', '1', 'created', fmt(now), 'updated', fmt(now))
  -- A PROCESSING record outlives its lease by the retention window: it never vanishes
  -- while its owner may still be executing.
  redis.call('PEXPIRE', k, retention + lease_ms)
  return {'proceed', fmt(now), 'fresh', '', '1', fmt(deadline), '1'}
end

-- Same key, different request (fingerprint or principal): changes nothing, in every state.
if cur[3] ~= ARGV[7] or cur[4] ~= ARGV[6] then
  return {'mismatch', fmt(now), state}
end

local kind
if state == 'SUCCEEDED' or state == 'FAILED_TERMINAL' then
  local rec = redis.call('HGETALL', k)
  local out = {'replay', fmt(now)}
  for i = 1, #rec do out[#out + 1] = rec[i] end
  return out
elseif state == 'FAILED_RETRYABLE' then
  kind = 'retry'
elseif state == 'PROCESSING' then
  local lease = tonumber(cur[6])
  if lease and lease > now then
    return {'in_progress', fmt(now), cur[5] or '', cur[6]}
  end
  kind = 'expired'
else
  return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown state ' .. state)
end

local version = tonumber(cur[2])
local attempts = tonumber(cur[7])
if not version or not attempts then
  return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has no version or attempts')
end
version = version + 1
attempts = attempts + 1
-- Takeover: a compare-and-set on the version, serialised by the script itself.
redis.call('HSET', k,
  'state', 'PROCESSING', 'version', fmt(version), 'owner', ARGV[8], 'lease', fmt(deadline),
  'attempts', fmt(attempts), 'updated', fmt(now))
redis.call('HDEL', k, 'completed', 'r_status', 'r_headers', 'r_body', 'r_ref')
redis.call('PEXPIRE', k, retention + lease_ms)
return {'proceed', fmt(now), kind, cur[5] or '', fmt(version), fmt(deadline), fmt(attempts)}
