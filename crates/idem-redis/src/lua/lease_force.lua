-- idem lease force-release (operator). ARGV[4] reason
-- Replies: {1, now, removed live lease…}; {0, now} nobody held it. Recorded either way.
local reason = ARGV[4]
local current = settle(load())
if current then
  current.granted = false
  save(current)
  push('force_released', current, nil, nil, reason)
  return reply(1, current)
end
push('force_released', nil, nil, nil, reason)
return reply(0, nil)
