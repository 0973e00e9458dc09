-- idem lease acquire. ARGV[4] owner   ARGV[5] ttl (ms)
-- Replies: {1, now, lease…} granted; {0, now, holder…} held by a live lease.
-- Token: max(counter + 1, token of the lease hash + 1, store time in µs), written back
-- to the counter. The time floor keeps tokens rising when the counter key is lost (an
-- unreplicated failover, a restart without persistence, garbage collection).
local owner, ttl = ARGV[4], tonumber(ARGV[5])
local current = load()
if current and current.expires_at > now then
  return reply(0, current)
end
local token = math.max(tonumber(redis.call('GET', counter_k) or '0') + 1, now_us)
if current then
  token = math.max(token, tonumber(current.token) + 1)
  settle(current)
end
local lease = {owner = owner, token = int(token), acquired_at = now,
               expires_at = now + ttl, renewals = 0}
-- The previous lease is over, so the counter may live exactly as long as this one.
redis.call('SET', counter_k, lease.token, 'PX', lease.expires_at - now + grace)
push('acquired', lease)
store(lease, true)
return reply(1, lease)
