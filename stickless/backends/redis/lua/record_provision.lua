-- KEYS: record hash. ARGV: agent, token.
-- Reply: {1, bound agent} after creating or raising the fence, {0, fence} when fenced out.
local cur = redis.call('HMGET', KEYS[1], 'agent', 'fence')
if not cur[1] then
  redis.call('HSET', KEYS[1], 'agent', ARGV[1], 'fence', ARGV[2])
  return {1, ARGV[1]}
end
local token = tonumber(ARGV[2])
local fence = tonumber(cur[2])
if token < fence then
  return {0, cur[2]}
end
if token > fence then
  redis.call('HSET', KEYS[1], 'fence', ARGV[2])
end
return {1, cur[1]}
