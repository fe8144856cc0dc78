-- KEYS: an index. ARGV: member.
-- Makes the member due at once: its score goes below both 0 and the score it had (a missing
-- member is added at -1). The score always changes, so a scan that read it before cannot
-- rescore it afterwards (index_rescore compares the score it saw): a deadline that moved
-- earlier meanwhile is never raised back to the later one the scan read. Reply: the new score.
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
local low = -1
if seen and tonumber(seen) <= 0 then
  low = tonumber(seen) - 1
end
redis.call('ZADD', KEYS[1], low, ARGV[1])
return tostring(low)
