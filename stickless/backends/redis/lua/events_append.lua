-- KEYS: event stream. ARGV: bound, ttl (ms), encoded frames...
-- Appends the frames in order, trimmed and expiring as the prelude's append_frames does.
-- Reply: the new ids, in order.
return append_frames(KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV, 3)
