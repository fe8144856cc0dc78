-- KEYS: lease hash, per-session token counter. ARGV: holder, token, ttl, token ttl (optional,
-- as in lease_acquire).
-- Reply: the new expiry, or nil when lost. The counter's expiry follows the lease's.
local t = now()
local cur = live_lease(KEYS[1], t)
if not cur or cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return false
end
local exp_at = t + tonumber(ARGV[3])
local exp = fmt(exp_at)
redis.call('HSET', KEYS[1], 'exp', exp)
expire_at(KEYS[1], exp_at)
keep_counter(KEYS[2], exp_at, tonumber(ARGV[4]))
return exp
