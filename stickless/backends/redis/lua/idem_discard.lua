-- KEYS: reservation hash. ARGV: turn. Deletes an IN_FLIGHT reservation of that turn.
-- Reply: {1, holder or ''} when deleted, {0} otherwise.
local r = load_reservation(KEYS[1], now())
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[1] then
  return {0}
end
redis.call('DEL', KEYS[1])
return {1, r.holder or ''}
