-- KEYS: reservation hash. ARGV: holder (known dead), turn.
-- Moves the stale deadline of the IN_FLIGHT reservation of that turn held by that holder to one
-- microsecond before now (stale means strictly past the deadline), unless already past.
-- Reply: {1, deadline} when moved, {2, deadline} when already stale (still held: the member
-- stays), {0} when not IN_FLIGHT for that turn and holder (the holder-index member is dead).
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.holder ~= ARGV[1] or r.turn ~= ARGV[2] then
  return {0}
end
if t > tonumber(r.stale) then
  return {2, r.stale}
end
local stale = fmt(t - 0.000001)
redis.call('HSET', KEYS[1], 'stale', stale)
return {1, stale}
