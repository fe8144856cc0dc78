-- KEYS: reservation hash, pending ids, pending entries.
-- ARGV: 'hold' or 'retry', turn, holder, lease token, packed envelope, attempt, reason, delay,
-- forward ttl, ms the pending set lives after a write.
-- Keeps the message of a turn held by the holder in the pending set under the token (as a
-- collect would have: packed {envelope, arrival}), under its recorded pending id or a new one.
-- 'retry' also records the failed attempt (which must be the held one) in the history and makes
-- the reservation holderless, not to be taken over before the delay is over and stale the
-- forward ttl after that.
-- Reply: {message id, stale deadline} (the same for a rerun after a lost reply), else {0}.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[2] then
  return {0}
end
local retry = ARGV[1] == 'retry'
if retry and not r.holder then
  local last = last_attempt(r)
  if last and last[1] == tonumber(ARGV[6]) and last[2] == ARGV[3] and r.given == 'retry' and
    r.pending then
    return {r.pending, r.stale}
  end
end
if r.holder ~= ARGV[3] or (retry and held_attempt(r) ~= tonumber(ARGV[6])) then
  return {0}
end
local id = r.pending or ('held:' .. ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], id)
redis.call('HSET', KEYS[3], id, cmsgpack.pack({ARGV[5], fmt(t)}))
redis.call('PEXPIRE', KEYS[2], ARGV[10])
redis.call('PEXPIRE', KEYS[3], ARGV[10])
redis.call('HSET', KEYS[1], 'pending', id)
if not retry then
  return {id, r.stale}
end
give_up_attempt(KEYS[1], r, ARGV[7], t, 'retry')
local due = t + tonumber(ARGV[8])
local stale = fmt(due + tonumber(ARGV[9]))
redis.call('HDEL', KEYS[1], 'holder', 'inc')
redis.call('HSET', KEYS[1], 'due', fmt(due), 'touched', fmt(t), 'stale', stale)
return {id, stale}
