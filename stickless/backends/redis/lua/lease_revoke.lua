-- KEYS: lease hash. ARGV: holder.
-- Deletes the lease if that holder's and left by a dead incarnation; a live incarnation's is
-- kept. The token counter is left alone, so the next acquire gets a larger token.
-- Reply: 1 when deleted, 2 when held by a live incarnation of the holder, 0 otherwise.
local cur = redis.call('HMGET', KEYS[1], 'holder', 'inc')
if cur[1] ~= ARGV[1] then
  return 0
end
if holder_alive(cur[1], cur[2]) then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
