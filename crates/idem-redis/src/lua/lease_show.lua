-- idem lease show (read only). Reply: {last token or 0, now[, lease…]}; the lease may be
-- expired (Rust reports only a live one as the holder).
local s = load()
if not s then return reply(0, nil) end
local last = math.max(tonumber(s.token), s.floor or 0)
if s.granted then return reply(last, s) end
return reply(last, nil)
