-- idem lease evidence: an authoritative fence refused a write carrying this store's
-- token. ARGV[4] owner   ARGV[5] token   ARGV[6] detail   Reply: now
local s = load()
push('fenced_write_rejected', nil, ARGV[4], ARGV[5], ARGV[6])
reply(0, s)
return now
