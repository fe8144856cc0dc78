-- KEYS: the holder's liveness key, the liveness index. ARGV: holder, incarnation, ttl.
-- Starts the incarnation (whatever the key named before is dead from now on) and marks the
-- holder for the dead-holder sweep (score 0), which cleans up after an earlier incarnation;
-- renewals then keep the score at the liveness deadline. Reply: 1.
local t = now()
redis.call('SET', KEYS[1], ARGV[2])
expire_at(KEYS[1], t + tonumber(ARGV[3]))
redis.call('ZADD', KEYS[2], 0, ARGV[1])
return 1
