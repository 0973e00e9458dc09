-- idem lease evidence retention: drops the oldest events of one list recorded before a
-- time. Events are appended in time order, so the old ones are the list's head.
-- KEYS[1] event list   ARGV[1] before (store ms)   ARGV[2] most to drop
-- Reply: how many were dropped.
local before, most = tonumber(ARGV[1]), tonumber(ARGV[2])
local ok, head = pcall(redis.call, 'LRANGE', KEYS[1], 0, most - 1)
if not ok then
  return 0 -- not a list: not an event log of this store
end
local n = 0
for _, raw in ipairs(head) do
  local ok, event = pcall(cjson.decode, raw)
  if not ok or type(event) ~= 'table' or type(event.at) ~= 'number' or event.at >= before then
    break
  end
  n = n + 1
end
if n > 0 then
  redis.call('LTRIM', KEYS[1], n, -1)
end
return n
