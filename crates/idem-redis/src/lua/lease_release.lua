-- idem lease release: compare owner and token, then delete. ARGV[4] owner   ARGV[5] token
-- Replies: {1, now, released lease…}; {0, now[, current live lease…]} owner mismatch.
local owner, token = ARGV[4], ARGV[5]
local lease = load()
if holds(lease, owner, token) then
  redis.call('DEL', lease_k)
  push('released', lease)
  return reply(1, lease)
end
local current = settle(lease)
push('release_owner_mismatch', nil, owner, token, holder_detail(current))
return reply(0, current)
