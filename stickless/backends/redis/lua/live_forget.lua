-- KEYS: the liveness index. ARGV: holder.
-- The dead-holder sweep cleaned up after the holder: drop it when its incarnation is dead, else
-- (a live holder's mark of 0) score it at its liveness deadline, so its death is seen later.
-- Reply: 1 when dropped.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) >= now() then
  return 0
end
local ms = redis.call('PEXPIRETIME', live_key(ARGV[1]))
if ms > 0 then
  redis.call('ZADD', KEYS[1], fmt((ms + 1) / 1000), ARGV[1])
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
