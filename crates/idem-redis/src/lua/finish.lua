-- idem finish: compare-and-set on state PROCESSING + version + owner, then record the end.
-- KEYS[1] record key
-- ARGV[1] clock shift (ms)   ARGV[2] retention (ms)   ARGV[3] owner block
-- ARGV[4] version   ARGV[5] new state ('S' | 'T' | 'R')   ARGV[6] result block ('' = none)
-- Replies: nil (superseded: nothing changed) or the new record without its result
-- (header, owner and identity blocks); the caller has the result it sent.
local k = KEYS[1]
local owner = ARGV[3]
local v = redis.call('GET', k)
if not v then
  return false
end
local fmt, state, version, _, attempts, created = struct.unpack('>Bc1i8i8i4i8', v)
if fmt ~= 1 then
  return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown format')
end
if state ~= 'P' or version ~= tonumber(ARGV[4]) or string.sub(v, 47, 46 + #owner) ~= owner then
  return false
end
if redis.replicate_commands then redis.replicate_commands() end -- Redis < 5
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])
local new_state = ARGV[5]
local completed = 0
if new_state == 'S' or new_state == 'T' then
  completed = now
end
local ident_at = 47 + #owner
local ident_len = struct.unpack('>I2', v, ident_at)
-- The lease ends (a finished record holds none); owner and identity stay.
local head = struct.pack('>Bc1i8i8i4i8i8i8', 1, new_state, version + 1, 0, attempts, created,
  now, completed) .. string.sub(v, 47, ident_at + 1 + ident_len)
-- Retention counts from the end of the execution.
redis.call('SET', k, head .. ARGV[6], 'PX', ARGV[2])
return head
