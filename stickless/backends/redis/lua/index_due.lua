-- KEYS: a cluster-wide sorted-set index. ARGV: age, offset, count.
-- Reply: {now, cutoff, {member, score, ...}} for members scored before now - age.
local t = now()
local cutoff = fmt(t - tonumber(ARGV[1]))
local hits = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. cutoff, 'WITHSCORES', 'LIMIT',
  ARGV[2], ARGV[3])
return {fmt(t), cutoff, hits}
