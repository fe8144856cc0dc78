-- KEYS: the holder's liveness key, the liveness index, the holder's lease index, the holder's
-- reservation index. ARGV: holder, incarnation, ttl, ms the holder's indexes live from now.
-- Keeps the incarnation alive for ttl (only while the key still names it: an expired, retired
-- or replaced incarnation never comes back), its index score at the liveness deadline (a mark
-- of 0 is left for the dead-holder sweep), and the holder's indexes alive (never shortened).
-- Reply: 1 renewed, 0 not alive.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
local t = now()
-- (scored a millisecond past the key's own expiry, so a holder listed dead has no key left)
local ms = math.ceil((t + tonumber(ARGV[3])) * 1000)
redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', ms))
local deadline = (ms + 1) / 1000
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score or tonumber(score) > 0 then
  redis.call('ZADD', KEYS[2], fmt(deadline), ARGV[1])
end
for i = 3, 4 do
  redis.call('PEXPIRE', KEYS[i], ARGV[4], 'NX')
  redis.call('PEXPIRE', KEYS[i], ARGV[4], 'GT')
end
return 1
