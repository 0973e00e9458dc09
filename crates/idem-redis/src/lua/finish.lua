-- idem finish: compare-and-set on state PROCESSING + version + owner, then record the end.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] retention (ms)   ARGV[3] owner   ARGV[4] version
-- ARGV[5] new state   ARGV[6] has result ('1'|'0')   ARGV[7] status   ARGV[8] headers (JSON)
-- ARGV[9] body (bytes)   ARGV[10] has result_ref ('1'|'0')   ARGV[11] result_ref
-- Replies: {'superseded'} (nothing changed) or {'ok', <HGETALL of the record>...}
if redis.replicate_commands then redis.replicate_commands() end
local function fmt(n) return string.format('%d', n) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local k = KEYS[1]

local cur = redis.call('HMGET', k, 'state', 'version', 'owner')
if cur[1] ~= 'PROCESSING' or tonumber(cur[2]) ~= tonumber(ARGV[4]) or cur[3] ~= ARGV[3] then
  return {'superseded'}
end
local state = ARGV[5]
redis.call('HSET', k, 'state', state, 'version', fmt(tonumber(cur[2]) + 1), 'updated', fmt(now))
redis.call('HDEL', k, 'lease')
if state == 'SUCCEEDED' or state == 'FAILED_TERMINAL' then
  redis.call('HSET', k, 'completed', fmt(now))
else
  redis.call('HDEL', k, 'completed')
end
redis.call('HDEL', k, 'r_status', 'r_headers', 'r_body', 'r_ref')
if ARGV[6] == '1' then
  redis.call('HSET', k, 'r_status', ARGV[7], 'r_headers', ARGV[8], 'r_body', ARGV[9])
  if ARGV[10] == '1' then
    redis.call('HSET', k, 'r_ref', ARGV[11])
  end
end
-- Retention counts from the end of the execution.
redis.call('PEXPIRE', k, tonumber(ARGV[2]))
local rec = redis.call('HGETALL', k)
local out = {'ok'}
for i = 1, #rec do out[#out + 1] = rec[i] end
return out
