-- KEYS: lease hash. ARGV: holder (known dead).
-- Deletes the lease if unexpired and held by that holder; the token counter is left alone, so
-- the next acquire gets a larger token. Reply: 1 when revoked, 0 when not held by the holder.
local cur = live_lease(KEYS[1], now())
if not cur or cur[1] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
