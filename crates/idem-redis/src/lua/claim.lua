-- idem claim: decides the key-state table (docs/DESIGN.md) / idem_core::decide atomically for one record.
-- The record is one string value (layout in lib.rs, "Record encoding"): a fixed
-- 46-byte header, the owner block, the identity block, then the result.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] lease (ms)   ARGV[3] retention (ms)
-- ARGV[4] owner block (u16 length + owner)
-- ARGV[5] identity block (u16 length + principal, fingerprint, tenant, key)
-- Replies:
--   the record value itself (bulk string): replay (SUCCEEDED / FAILED_TERMINAL)
--   {1, kind (1 fresh, 2 retry, 3 expired), version, lease_deadline, attempts, previous_owner}
--   {2, now, lease_deadline, owner}: in progress
--   {3, state}: mismatch
local k = KEYS[1]
local ident = ARGV[5]
local v = redis.call('GET', k)
if v then
  local fmt, state, version, lease, attempts, created, _, _, owner, pos =
    struct.unpack('>Bc1i8i8i4i8i8i8I2c0', v)
  if fmt ~= 1 then
    return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown format')
  end
  -- Same key, different request (fingerprint or principal): changes nothing, in every
  -- state. The identity block is length-prefixed, so a prefix match is an exact match.
  if string.sub(v, pos, pos + #ident - 1) ~= ident then
    return {3, state}
  end
  -- Replay needs no clock and writes nothing: hand back the stored value as is.
  if state == 'S' or state == 'T' then
    return v
  end
  if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
  local kind
  if state == 'P' then
    if lease > now then
      return {2, now, lease, owner}
    end
    kind = 3
  elseif state == 'R' then
    kind = 2
  else
    return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown state ' .. state)
  end
  -- Takeover: a compare-and-set on the version, serialised by the script itself. The
  -- previous attempt's result is dropped; identity and creation time stay.
  local lease_ms = tonumber(ARGV[2])
  local deadline = now + lease_ms
  version = version + 1
  attempts = attempts + 1
  redis.call('SET', k,
    struct.pack('>Bc1i8i8i4i8i8i8', 1, 'P', version, deadline, attempts, created, now, 0)
      .. ARGV[4] .. ident,
    'PX', tonumber(ARGV[3]) + lease_ms)
  return {1, kind, version, deadline, attempts, owner}
end

if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local deadline = now + lease_ms
-- A PROCESSING record outlives its lease by the retention window: it never vanishes
-- while its owner may still be executing.
redis.call('SET', k,
  struct.pack('>Bc1i8i8i4i8i8i8', 1, 'P', 1, deadline, 1, now, now, 0) .. ARGV[4] .. ident,
  'PX', tonumber(ARGV[3]) + lease_ms)
return {1, 1, 1, deadline, 1, ''}
