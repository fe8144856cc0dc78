-- KEYS: lease hash. ARGV: holder, token.
-- Reply: 1 when released, 0 when not held so, 2 when not released but the same holder holds the
-- session under another token (its holder-index member must stay).
local cur = live_lease(KEYS[1], now())
if not cur or cur[1] ~= ARGV[1] then
  return 0
end
if cur[2] ~= ARGV[2] then
  return 2
end
redis.call('DEL', KEYS[1])
return 1
