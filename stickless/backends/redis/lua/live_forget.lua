-- KEYS: the liveness index. ARGV: holder.
-- Drops the holder unless a renewal scored it ahead of now meanwhile. Reply: 1 when dropped.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) < now() then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 1
end
return 0
