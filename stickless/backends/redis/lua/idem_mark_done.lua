-- KEYS: reservation hash, record hash, transcript list, the session's dead-letter hash.
-- ARGV: holder, turn, state (DONE or FAILED), outcome, primary ttl, the attempt that answers
-- ('' for a turn that never started), dead letter id ('' for none), packed letter, commit token
-- ('' for none), packed entries...
-- Records the outcome, and appends the turn's entries under the token, in one step: only if the
-- reservation is IN_FLIGHT for that turn, held by holder or nobody, and the token is not older
-- than the record's fence; an attempt's answer only while the holder holds that attempt. Safe to run twice: a run that finds its own outcome already recorded
-- for the turn reports success and writes nothing.
-- Reply: {1} recorded, {0} refused (not this turn's in-flight reservation), {2, fence} fenced out.
local t = now()
local r = load_reservation(KEYS[1], t)
-- The same call run again (a retry after a lost reply) finds its own outcome: recorded.
if r and r.turn == ARGV[2] and r.state ~= 'IN_FLIGHT' and r.outcome == ARGV[4] then
  return {1}
end
-- A fenced-out commit is reported next: its holder has lost the session and must know.
if ARGV[9] ~= '' then
  local fence = redis.call('HGET', KEYS[2], 'fence')
  if not fence or tonumber(ARGV[9]) < tonumber(fence) then
    return {2, fence or ''}
  end
end
if not r or r.turn ~= ARGV[2] or r.state ~= 'IN_FLIGHT' then
  return {0}
end
if r.holder and r.holder ~= ARGV[1] then
  return {0}
end
if ARGV[6] ~= '' and (not r.holder or held_attempt(r) ~= tonumber(ARGV[6])) then
  return {0}
end
if ARGV[9] ~= '' then
  local batch = 1000
  for first = 10, #ARGV, batch do
    redis.call('RPUSH', KEYS[3], unpack(ARGV, first, math.min(first + batch - 1, #ARGV)))
  end
end
local exp_at = t + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'outcome', ARGV[4], 'touched', fmt(t),
  'exp', fmt(exp_at))
expire_at(KEYS[1], exp_at)
if ARGV[7] ~= '' and redis.call('HEXISTS', KEYS[4], ARGV[7]) == 0 then
  redis.call('HSET', KEYS[4], ARGV[7], letter_stamp(ARGV[8], t))
end
return {1}
