-- KEYS: the session's dead-letter hash. ARGV: letter id, packed letter (dead_at 0: stamped now).
-- Keeps the letter unless one with its id is kept. Reply: {1 when added else 0, the kept
-- letter's dead_at, or '0' when its header is unreadable}.
local kept = redis.call('HGET', KEYS[1], ARGV[1])
local added = 0
if not kept then
  kept = letter_stamp(ARGV[2], now())
  redis.call('HSET', KEYS[1], ARGV[1], kept)
  added = 1
end
local stamp = '0'
if string.sub(kept, 1, 3) == '\147\1\203' and #kept >= 11 then
  stamp = fmt(struct.unpack('>d', string.sub(kept, 4, 11)))
end
return {added, stamp}
