-- KEYS: an index. ARGV: member, score seen by the scan, new score.
-- Moves the member only if nobody rescored it since the scan read it. Reply: 1 when moved.
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seen and tonumber(seen) == tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
  return 1
end
return 0
