-- KEYS: the session's pending ids (sorted set by lease token) and pending entries (hash).
-- ARGV: lease token, then the message ids answered under it.
-- Drops each id that is pending under that token (others are left alone: a newer holder took
-- them over). Reply: how many were dropped.
local dropped = 0
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    dropped = dropped + 1
  end
end
return dropped
