-- idem lease show (read only). Reply: {last token or 0, now[, lease hash…]}; the lease
-- may be expired (Rust reports only a live one as the holder).
local lease = load()
local last = tonumber(redis.call('GET', counter_k) or '0')
if lease then last = math.max(last, tonumber(lease.token)) end
return reply(last, lease)
