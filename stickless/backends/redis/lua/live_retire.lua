-- KEYS: the holder's liveness key, the liveness index. ARGV: holder, incarnation ('' = any).
-- Ends the holder's incarnation now and marks it for the dead-holder sweep (score 0).
-- Reply: 1 when one was alive, 0 otherwise.
local cur = redis.call('GET', KEYS[1])
if not cur or (ARGV[2] ~= '' and cur ~= ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
