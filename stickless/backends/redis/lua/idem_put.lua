-- KEYS: reservation hash, record hash, the stale index, the holder's reservation index, the
-- session's three inbox tiers, its pending ids, its lease hash, the turn's index string.
-- ARGV: turn, input hash, holder, secondary ttl, primary ttl, the reservation's index member,
-- ms the holder's index lives, agent ('' for no binding check), the reservation's key.
-- Reserves the key for the turn, held under the holder's live incarnation (none: it is stale at
-- once), and indexes it (stale index due at once: the first scan verifies and rescores it;
-- holder index; the turn's index string names the key, expiring with the reservation, so the
-- turn is found by its id); with an agent, only if the session is not bound to another one.
-- Reply: {1, stale deadline, quiet} when reserved (or already reserved by this very call: a
-- rerun after a lost reply finds its own reservation), quiet 1 when the inbox held nothing and
-- nothing was pending under a lease older than the current one; {0, reservation} when another
-- exists (not FAILED, or FAILED for this very turn), {3, agent} when bound to another agent.
local function quiet()
  for i = 5, 7 do
    if redis.call('EXISTS', KEYS[i]) == 1 then
      return 0
    end
  end
  local token = redis.call('HGET', KEYS[9], 'token')
  if token then
    token = '(' .. token
  else
    token = '+inf'
  end
  if #redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', token, 'LIMIT', 0, 1) > 0 then
    return 0
  end
  return 1
end
local function indexed(stale)
  redis.call('ZADD', KEYS[3], 'LT', 0, ARGV[6])
  hold_member(KEYS[4], ARGV[6], ARGV[7])
  return {1, stale, quiet()}
end
if ARGV[8] ~= '' then
  local bound = redis.call('HGET', KEYS[2], 'agent')
  if bound and bound ~= ARGV[8] then
    return {3, bound}
  end
end
local t = now()
local r = load_reservation(KEYS[1], t)
if r and r.turn == ARGV[1] and r.state == 'IN_FLIGHT' and r.holder == ARGV[3] then
  return indexed(r.stale)
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
redis.call('SET', KEYS[10], ARGV[9])
expire_at(KEYS[10], exp_at)
return indexed(stale)
