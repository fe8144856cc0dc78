-- KEYS: reservation hash, pending ids. ARGV: turn, holder, reason, max attempts, forward ttl.
-- Gives a lost attempt's turn back for a next attempt: if IN_FLIGHT for the turn, held by the
-- holder, its message still pending and its attempt below the maximum, makes it holderless
-- (stale after the forward ttl) with the attempt in its history.
-- Reply: {attempt lost, stale deadline} (the same for a rerun after a lost reply), else {0}.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[1] then
  return {0}
end
local last = last_attempt(r)
if not r.holder and last and last[2] == ARGV[2] and r.given == 'lost' then
  return {last[1], r.stale}
end
if r.holder ~= ARGV[2] or not may_run_again(r, KEYS[2], tonumber(ARGV[4])) then
  return {0}
end
local lost = give_up_attempt(KEYS[1], r, ARGV[3], t, 'lost')
local stale = fmt(t + tonumber(ARGV[5]))
redis.call('HDEL', KEYS[1], 'holder', 'inc')
redis.call('HSET', KEYS[1], 'touched', fmt(t), 'stale', stale)
return {lost, stale}
