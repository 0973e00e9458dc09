-- idem lease release: compare owner and token, then end the lease (its token stays).
-- ARGV[4] owner   ARGV[5] token
-- Replies: {1, now, released lease…}; {0, now[, current live lease…]} owner mismatch.
local owner, token = ARGV[4], ARGV[5]
local s = load()
if holds(s, owner, token) then
  s.granted = false
  save(s)
  push('released', s)
  return reply(1, s)
end
local current = settle(s)
push('release_owner_mismatch', nil, owner, token, holder_detail(current))
return reply(0, current)
