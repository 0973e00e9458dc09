-- idem extend_lease: compare-and-set on state PROCESSING + version + owner, then push the
-- lease deadline to store-now + lease. The version does not change: the token stays good.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] lease (ms)   ARGV[3] retention (ms)
-- ARGV[4] owner block   ARGV[5] version
-- Replies: nil (superseded: nothing changed) or the new deadline
local k = KEYS[1]
local owner = ARGV[4]
local v = redis.call('GET', k)
if not v then
  return false
end
local fmt, state, version, _, attempts, created = struct.unpack('>Bc1i8i8i4i8', v)
if fmt ~= 1 then
  return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown format')
end
if state ~= 'P' or version ~= tonumber(ARGV[5]) or string.sub(v, 47, 46 + #owner) ~= owner then
  return false
end
if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local deadline = now + lease_ms
redis.call('SET', k,
  struct.pack('>Bc1i8i8i4i8i8i8', 1, 'P', version, deadline, attempts, created, now, 0)
    .. string.sub(v, 47),
  'PX', tonumber(ARGV[3]) + lease_ms)
return deadline
