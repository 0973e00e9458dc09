-- idem lease renew. ARGV[4] owner   ARGV[5] token   ARGV[6] ttl (ms)
-- Replies: {1, now, renewed lease…}; {0, now[, current live lease…]} not the holder.
local owner, token, ttl = ARGV[4], ARGV[5], tonumber(ARGV[6])
local s = load()
if holds(s, owner, token) then
  s.expires_at = now + ttl
  s.renewals = s.renewals + 1
  save(s)
  push('renewed', s)
  return reply(1, s)
end
local current = settle(s)
push('renew_rejected', nil, owner, token, holder_detail(current))
return reply(0, current)
