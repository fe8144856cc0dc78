-- KEYS: reservation hash, record hash, the stale index, the holder's reservation index, the
-- session's three inbox tiers, its pending ids, its lease hash, this delivery's key and the
-- pending index (used with a forward), the turn's index string.
-- ARGV: turn, input hash, holder, secondary ttl, primary ttl, the reservation's index member,
-- ms the holder's index lives, agent ('' for no binding check), the reservation's key; with a
-- forward: the encoded envelope ('' for none), its tier index, seconds the delivery is
-- remembered, tier ttl (ms), seconds the holderless reservation stays fresh, the control
-- channel, the session id (each '' without a forward); the submit's traceparent ('' for none).
-- Reserves the key for the turn, held under the holder's live incarnation (none: it is stale at
-- once), and indexes it (stale index due at once: the first scan verifies and rescores it;
-- holder index; the turn's index string names the key, expiring with the reservation, so the
-- turn is found by its id); with an agent, only if the session is not bound to another one. With a
-- forward, when another live holder has the session's lease, the reservation is made
-- holderless instead, the envelope queued (once per delivery) and the holder's doorbell rung.
-- Reply: {1, stale deadline, quiet} when reserved (or already reserved by this very call: a
-- rerun after a lost reply finds its own reservation), quiet 1 when the inbox held nothing and
-- nothing was pending under a lease older than the current one; {4, stream id, holder, token}
-- when reserved and queued for that holder (or queued by this very call before); {0,
-- reservation} when another exists (not FAILED, or FAILED for this very turn), {3, agent} when
-- bound to another agent.
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
-- Queue the envelope for `cur`'s holder and ring its doorbell (the bytes the signal bus sends).
local function queue(t, cur)
  local arrived = fmt(t)
  local was_empty = redis.call('EXISTS', KEYS[5], KEYS[6], KEYS[7]) == 0
  local tier = KEYS[5 + tonumber(ARGV[11])]
  local id = redis.call('XADD', tier, '*', 'e', ARGV[10], 't', arrived, 'k', ARGV[9], 'u',
    ARGV[1])
  redis.call('PEXPIRE', tier, ARGV[13])
  redis.call('SET', KEYS[10], id .. ' ' .. arrived, 'EX', ARGV[12])
  if was_empty then
    redis.call('ZADD', KEYS[11], arrived, ARGV[16])
  else
    redis.call('ZADD', KEYS[11], 'NX', arrived, ARGV[16])
  end
  redis.call('PUBLISH', ARGV[15], cmsgpack.pack({kind = 'MESSAGE_ENQUEUED',
    session_id = ARGV[16], origin = ARGV[3], payload = {held_by = cur[1]}}))
  return {4, id, cur[1], cur[2]}
end
local forwarding = ARGV[10] ~= nil and ARGV[10] ~= ''
if ARGV[8] ~= '' then
  local bound = redis.call('HGET', KEYS[2], 'agent')
  if bound and bound ~= ARGV[8] then
    return {3, bound}
  end
end
local t = now()
if forwarding then
  local known = redis.call('GET', KEYS[10])
  if known then
    local cur = live_lease(KEYS[9], t) or {'', '0'}
    return {4, string.sub(known, 1, string.find(known, ' ', 1, true) - 1), cur[1], cur[2]}
  end
end
local r = load_reservation(KEYS[1], t)
if r and r.turn == ARGV[1] and r.state == 'IN_FLIGHT' and r.holder == ARGV[3] then
  return indexed(r.stale)
end
-- A FAILED one is free for a new turn, but not for its own: a rerun of this very call after
-- the turn was declared lost in between must not bring the turn back to life.
if r and (r.state ~= 'FAILED' or r.turn == ARGV[1]) then
  return {0, reservation_reply(r, t)}
end
local exp_at = t + tonumber(ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[12], ARGV[9])
expire_at(KEYS[12], exp_at)
local cur = forwarding and live_lease(KEYS[9], t)
if cur and cur[1] ~= ARGV[3] then
  redis.call('HSET', KEYS[1], 'turn', ARGV[1], 'hash', ARGV[2], 'state', 'IN_FLIGHT',
    'touched', fmt(t), 'stale', fmt(t + tonumber(ARGV[14])), 'exp', fmt(exp_at), 'tp', ARGV[17])
  expire_at(KEYS[1], exp_at)
  redis.call('ZADD', KEYS[3], 'LT', 0, ARGV[6])
  return queue(t, cur)
end
local stale = fmt(t + tonumber(ARGV[4]))
redis.call('HSET', KEYS[1], 'turn', ARGV[1], 'hash', ARGV[2], 'holder', ARGV[3],
  'inc', redis.call('GET', live_key(ARGV[3])) or '', 'state', 'IN_FLIGHT', 'touched', fmt(t),
  'stale', stale, 'exp', fmt(exp_at), 'tp', ARGV[17])
expire_at(KEYS[1], exp_at)
return indexed(stale)
