-- KEYS: reservation hash. ARGV: holder (its incarnation ended), turn.
-- Reply: {1, score} when the IN_FLIGHT reservation of that turn is held by a dead incarnation
-- of that holder (its stale-index entry goes to `score`, due now), {2} when held by a live one
-- (left alone), {0} when not IN_FLIGHT for that turn and holder (the holder-index member is
-- dead).
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.holder ~= ARGV[1] or r.turn ~= ARGV[2] then
  return {0}
end
if holder_alive(r.holder, r.inc) then
  return {2}
end
return {1, fmt(t - 0.000001)}
