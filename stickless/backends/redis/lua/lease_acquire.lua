-- KEYS: lease hash, per-session token counter. ARGV: holder, ttl, token ttl (optional: without
-- it the counter's expiry is left as it is).
-- Reply: {1, holder, token, exp} when granted or refreshed, {0, holder, token, exp} when held
-- elsewhere. Tokens grow across release, record delete and the counter's own expiry: a missing
-- counter starts from the server clock in microseconds (see next_token), and the counter
-- expires `token ttl` after the lease it last served.
local t = now()
local exp_at = t + tonumber(ARGV[2])
local exp = fmt(exp_at)
local token_ttl = tonumber(ARGV[3])
local cur = live_lease(KEYS[1], t)
if cur then
  if cur[1] ~= ARGV[1] then
    return {0, cur[1], cur[2], cur[3]}
  end
  redis.call('HSET', KEYS[1], 'exp', exp)
  expire_at(KEYS[1], exp_at)
  keep_counter(KEYS[2], exp_at, token_ttl)
  return {1, cur[1], cur[2], exp}
end
local token = next_token(KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'exp', exp)
expire_at(KEYS[1], exp_at)
keep_counter(KEYS[2], exp_at, token_ttl)
return {1, ARGV[1], token, exp}
