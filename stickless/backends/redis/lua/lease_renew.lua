-- KEYS: lease hash. ARGV: holder, token, ttl. Reply: the new expiry, or nil when lost.
local t = now()
local cur = live_lease(KEYS[1], t)
if not cur or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return false
end
local exp_at = t + tonumber(ARGV[3])
local exp = fmt(exp_at)
redis.call('HSET', KEYS[1], 'exp', exp)
expire_at(KEYS[1], exp_at)
return exp
