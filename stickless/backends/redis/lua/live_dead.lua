-- KEYS: the liveness index. ARGV: limit.
-- Reply: up to limit holders scored before now: past their liveness deadline, or marked for
-- the sweep (0) by a registration or retirement.
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now()), 'LIMIT', 0, ARGV[1])
