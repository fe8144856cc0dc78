-- KEYS: reservation hash. ARGV: holder, secondary ttl.
-- Reply: {1, turn, stale deadline} when touched to an earlier deadline than before (the stale
-- index must then be lowered), {0} when touched later (the usual case) or not touched at all.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.holder ~= ARGV[1] then
  return {0}
end
local stale_at = t + tonumber(ARGV[2])
local stale = fmt(stale_at)
redis.call('HSET', KEYS[1], 'touched', fmt(t), 'stale', stale)
if stale_at < tonumber(r.stale) then
  return {1, r.turn, stale}
end
return {0}
