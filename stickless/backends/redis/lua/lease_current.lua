-- KEYS: lease hash. Reply: {holder, token, exp} of the unexpired lease, or nil.
local cur = live_lease(KEYS[1], now())
if not cur then
  return false
end
return cur
