-- KEYS: reservation hash. ARGV: turn. Deletes an IN_FLIGHT reservation of that turn that no
-- holder has taken over (no attempt, no history): a refused submit's reservation, even one
-- whose message was queued, never one a holder may be running (a retry of the refused submit
-- would run that turn a second time).
-- Reply: {1, holder or ''} when deleted, {0} otherwise.
local r = load_reservation(KEYS[1], now())
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[1] or r.attempt > 0 or r.history then
  return {0}
end
redis.call('DEL', KEYS[1])
return {1, r.holder or ''}
