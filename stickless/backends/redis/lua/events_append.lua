-- KEYS: event stream. ARGV: bound, ttl (ms), encoded frames...
-- Appends the frames in order, trims exactly to the newest `bound`, records the newest dropped
-- id as the stream's max-deleted-entry-id (XSETID, Redis >= 7.0) so reads can tell a trimmed
-- cursor from one that lost nothing, and expires the whole log `ttl` after this append.
-- Reply: the new ids, in order.
local bound = tonumber(ARGV[1])
local ids = {}
for i = 3, #ARGV do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'f', ARGV[i])
end
local excess = redis.call('XLEN', KEYS[1]) - bound
if excess > 0 then
  local dropped = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess)
  redis.call('XTRIM', KEYS[1], 'MAXLEN', bound)
  redis.call('XSETID', KEYS[1], ids[#ids], 'MAXDELETEDID', dropped[#dropped][1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return ids
