-- KEYS: reservation hash. ARGV: turn, input hash, holder, secondary ttl, primary ttl.
-- The reservation is held under the holder's live incarnation (none: it is stale at once).
-- Reply: {1, stale deadline} when reserved (or already reserved by this very call: a rerun
-- after a lost reply finds its own reservation), {0, reservation} when another exists (not
-- FAILED, or FAILED for this very turn).
local t = now()
local r = load_reservation(KEYS[1], t)
if r and r.turn == ARGV[1] and r.state == 'IN_FLIGHT' and r.holder == ARGV[3] then
  return {1, r.stale}
end
-- A FAILED one is free for a new turn, but not for its own: a rerun of this very call after
-- the turn was declared lost in between must not bring the turn back to life.
if r and (r.state ~= 'FAILED' or r.turn == ARGV[1]) then
  return {0, reservation_reply(r, t)}
end
local stale = fmt(t + tonumber(ARGV[4]))
local exp_at = t + tonumber(ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'turn', ARGV[1], 'hash', ARGV[2], 'holder', ARGV[3],
  'inc', redis.call('GET', live_key(ARGV[3])) or '', 'state', 'IN_FLIGHT', 'touched', fmt(t),
  'stale', stale, 'exp', fmt(exp_at))
expire_at(KEYS[1], exp_at)
return {1, stale}
