-- KEYS: lease hash, per-session token counter. ARGV: holder, token ttl.
-- Takes the lease under the holder's live incarnation: free, or left by a dead incarnation
-- (new token); the holder's own valid lease comes back with its token.
-- Reply: {1, holder, token, exp} when granted or already held, {0, holder, token, exp} when held
-- by another live holder, {2} when the holder itself has no live incarnation. `exp` is when
-- the lease holder's liveness ends unless renewed. Tokens grow across release, record delete
-- and the counter's own expiry: a missing counter starts from the server clock in
-- microseconds (see next_token); the counter expires `token ttl` after its last grant.
local t = now()
local inc = redis.call('GET', live_key(ARGV[1]))
if not inc then
  return {2}
end
local cur = live_lease(KEYS[1], t)
if cur then
  if cur[1] ~= ARGV[1] then
    return {0, cur[1], cur[2], cur[3]}
  end
  return {1, cur[1], cur[2], cur[3]}
end
local token = next_token(KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'inc', inc)
keep_counter(KEYS[2], t, tonumber(ARGV[2]))
return {1, ARGV[1], token, live_until(ARGV[1], t)}
