-- idem lease renew. ARGV[4] owner   ARGV[5] token   ARGV[6] ttl (ms)
-- Replies: {1, now, renewed lease…}; {0, now[, current live lease…]} not the holder.
local owner, token, ttl = ARGV[4], ARGV[5], tonumber(ARGV[6])
local lease = load()
if holds(lease, owner, token) then
  lease.expires_at = now + ttl
  lease.renewals = lease.renewals + 1
  push('renewed', lease)
  store(lease)
  return reply(1, lease)
end
local current = settle(lease)
push('renew_rejected', nil, owner, token, holder_detail(current))
return reply(0, current)
