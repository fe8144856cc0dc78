-- KEYS: reservation hash. ARGV: holder, secondary ttl, turn id.
-- Reply: {1, turn, stale deadline} when a holderless IN_FLIGHT one made for that turn was taken
-- (or was already taken by this holder: a rerun after a lost reply), else {0}.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[3] then
  return {0}
end
if r.holder and r.holder ~= ARGV[1] then
  return {0}
end
local stale = fmt(t + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'touched', fmt(t), 'stale', stale)
return {1, r.turn, stale}
