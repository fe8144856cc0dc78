-- KEYS: the session's tier streams (NOW, NEXT, LATER). ARGV: tier index, encoded envelope, ttl
-- (ms): the tier expires that long after its last delivery unless collected first.
-- Reply: {stream id, arrival time, 1 when the inbox was empty before}.
local t = fmt(now())
local was_empty = 0
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]) == 0 then
  was_empty = 1
end
local tier = KEYS[tonumber(ARGV[1]) + 1]
local id = redis.call('XADD', tier, '*', 'e', ARGV[2], 't', t)
redis.call('PEXPIRE', tier, ARGV[3])
return {id, t, was_empty}
