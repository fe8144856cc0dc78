-- KEYS: reservation hash. Reply: the reservation (see the prelude), or nil.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r then
  return false
end
return reservation_reply(r, t)
