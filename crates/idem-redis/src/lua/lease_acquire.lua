-- idem lease acquire. ARGV[4] owner   ARGV[5] ttl (ms)
-- Replies: {1, now, lease…} granted; {0, now, holder…} held by a live lease.
-- Token: max(token of the state + 1, store time in µs). The state key outlives the lease,
-- so its token is the counter; the time floor keeps tokens rising when the key is lost
-- (an unreplicated failover, a restart without persistence, garbage collection).
local owner, ttl = ARGV[4], tonumber(ARGV[5])
local s = load()
if s and s.granted and s.expires_at > now then
  return reply(0, s)
end
local token = now_us
if s then
  token = math.max(token, tonumber(s.token) + 1, (s.floor or 0) + 1)
  -- An expired lease is recorded here; the new state below replaces it.
  if s.granted then push('expired', s) end
end
local lease = {owner = owner, token = int(token), acquired_at = now,
               expires_at = now + ttl, renewals = 0, granted = true}
save(lease)
push('acquired', lease)
return reply(1, lease)
