-- KEYS: an index. ARGV: member, time its subject was seen empty.
-- Drops the member unless a later write rescored it. Reply: 1 when dropped.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
