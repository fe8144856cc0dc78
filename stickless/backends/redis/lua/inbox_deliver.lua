-- KEYS: the session's tier streams (NOW, NEXT, LATER), this delivery's key, the pending index.
-- ARGV: tier index, encoded envelope, seconds the delivery is remembered,
-- tier ttl (ms): the tier expires that long after its last delivery unless collected first,
-- the session id, the envelope's reservation key and turn id ('' when unknown: a take then
-- leaves its take-over to idem_acquire).
-- Appends the envelope unless this delivery id was appended before (the same call run again
-- after a lost reply): then it answers what the first run answered and appends nothing. The
-- pending index scores the session at its oldest arrival (this one when the inbox was empty).
-- Reply: {stream id, arrival time, 1 when the inbox was empty before}.
local known = redis.call('GET', KEYS[4])
if known then
  local sep = string.find(known, ' ', 1, true)
  return {string.sub(known, 1, sep - 1), string.sub(known, sep + 1), 0}
end
local t = fmt(now())
local was_empty = 0
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) == 0 then
  was_empty = 1
end
local tier = KEYS[tonumber(ARGV[1]) + 1]
local id = redis.call('XADD', tier, '*', 'e', ARGV[2], 't', t, 'k', ARGV[6], 'u', ARGV[7])
redis.call('PEXPIRE', tier, ARGV[4])
redis.call('SET', KEYS[4], id .. ' ' .. t, 'EX', ARGV[3])
if was_empty == 1 then
  redis.call('ZADD', KEYS[5], t, ARGV[5])
else
  redis.call('ZADD', KEYS[5], 'NX', t, ARGV[5])
end
return {id, t, was_empty}
