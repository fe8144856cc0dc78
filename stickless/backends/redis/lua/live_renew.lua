-- KEYS: the holder's liveness key, the liveness index, the holder's lease index, the holder's
-- reservation index. ARGV: holder, incarnation, ttl, index ttl.
-- Keeps the incarnation alive for ttl (only while the key still names it: an expired, retired
-- or replaced incarnation never comes back) and the holder's indexes for index ttl.
-- Reply: 1 renewed, 0 not alive.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local t = now()
local deadline = t + tonumber(ARGV[3])
expire_at(KEYS[1], deadline)
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if score and tonumber(score) > 0 then
  redis.call('ZADD', KEYS[2], fmt(deadline), ARGV[1])
end
if not score then
  redis.call('ZADD', KEYS[2], fmt(deadline), ARGV[1])
end
local index_until = t + tonumber(ARGV[4])
expire_at(KEYS[3], index_until)
expire_at(KEYS[4], index_until)
return 1
