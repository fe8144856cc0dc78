-- KEYS: the session's pending ids (sorted set by lease token) and pending entries (hash).
-- ARGV: lease token, then the message ids answered under it.
-- Drops each id that is pending under that token (others are left alone: a newer holder took
-- them over). Reply: how many were dropped.
local dropped = 0
for i = 2, #ARGV do
  dropped = dropped + ack_pending(KEYS[1], KEYS[2], ARGV[1], ARGV[i])
end
return dropped
