-- idem abandon: compare-and-set on state PROCESSING + version + owner, then remove the
-- record, as if the key had never been claimed.
-- KEYS[1] record key
-- ARGV[1] owner block   ARGV[2] version
-- Replies: 1 (removed) or 0 (superseded: nothing changed).
local k = KEYS[1]
local owner = ARGV[1]
local v = redis.call('GET', k)
if not v then
  return 0
end
local fmt, state, version = struct.unpack('>Bc1i8', v)
if fmt ~= 1 then
  return redis.error_reply('IDEMCORRUPT record ' .. k .. ' has unknown format')
end
if state ~= 'P' or version ~= tonumber(ARGV[2]) or string.sub(v, 47, 46 + #owner) ~= owner then
  return 0
end
redis.call('DEL', k)
return 1
