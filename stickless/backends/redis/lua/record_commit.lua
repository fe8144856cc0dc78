-- KEYS: record hash, transcript list. ARGV: token, packed entries...
-- Reply: {1} when appended, {0, ''} without record, {0, fence} when fenced out.
local fence = redis.call('HGET', KEYS[1], 'fence')
if not fence then
  return {0, ''}
end
if tonumber(ARGV[1]) < tonumber(fence) then
  return {0, fence}
end
local batch = 1000
for first = 2, #ARGV, batch do
  redis.call('RPUSH', KEYS[2], unpack(ARGV, first, math.min(first + batch - 1, #ARGV)))
end
return {1}
