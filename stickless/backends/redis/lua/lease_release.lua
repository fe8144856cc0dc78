-- KEYS: lease hash. ARGV: holder, token.
-- Reply: {1} when released, {0} when not held so, {2, ms left} when not released but the same
-- holder holds the session under another token for that long (its holder-index member must
-- stay).
local t = now()
local cur = live_lease(KEYS[1], t)
if not cur or cur[1] ~= ARGV[1] then
  return {0}
end
if cur[2] ~= ARGV[2] then
  return {2, math.ceil((tonumber(cur[3]) - t) * 1000)}
end
redis.call('DEL', KEYS[1])
return {1}
