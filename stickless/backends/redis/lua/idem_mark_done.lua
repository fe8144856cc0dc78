-- KEYS: reservation hash. ARGV: holder, turn, state (DONE or FAILED), outcome, primary ttl.
-- Records the outcome if IN_FLIGHT for that turn and held by holder or nobody. Reply: 1 or 0.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[2] then
  return 0
end
if r.holder and r.holder ~= ARGV[1] then
  return 0
end
local exp_at = t + tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'state', ARGV[3], 'outcome', ARGV[4], 'touched', fmt(t),
  'exp', fmt(exp_at))
expire_at(KEYS[1], exp_at)
return 1
