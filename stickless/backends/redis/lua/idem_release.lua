-- KEYS: reservation hash. ARGV: holder, forward ttl.
-- Reply: {1, turn, stale deadline} when made holderless, else {0}.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.holder ~= ARGV[1] then
  return {0}
end
local stale = fmt(t + tonumber(ARGV[2]))
redis.call('HDEL', KEYS[1], 'holder', 'inc')
redis.call('HSET', KEYS[1], 'touched', fmt(t), 'stale', stale)
return {1, r.turn, stale}
