-- idem extend_lease: compare-and-set on state PROCESSING + version + owner, then push the
-- lease deadline to store-now + lease. The version does not change: the token stays good.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] lease (ms)   ARGV[3] retention (ms)
-- ARGV[4] owner   ARGV[5] version
-- Replies: {'superseded'} (nothing changed) or {'ok', new_deadline}
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local k = KEYS[1]
local lease_ms = tonumber(ARGV[2])

local cur = redis.call('HMGET', k, 'state', 'version', 'owner')
if cur[1] ~= 'PROCESSING' or tonumber(cur[2]) ~= tonumber(ARGV[5]) or cur[3] ~= ARGV[4] then
  return {'superseded'}
end
local deadline = now + lease_ms
redis.call('HSET', k, 'lease', fmt(deadline), 'updated', fmt(now))
redis.call('PEXPIRE', k, tonumber(ARGV[3]) + lease_ms)
return {'ok', fmt(deadline)}
