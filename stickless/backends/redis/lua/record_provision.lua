-- KEYS: record hash. ARGV: agent to bind ('' for none), token.
-- Creates the record if missing, refuses a token older than its fence (nothing written), raises
-- the fence to the token, and binds the agent when one is given and the record is unbound.
-- Reply: {1, bound agent ('' while unbound)}, or {0, fence} when fenced out.
local record = KEYS[1]
local agent, token = ARGV[1], tonumber(ARGV[2])
local cur = redis.call('HMGET', record, 'agent', 'fence')
local bound, fence = cur[1], cur[2]
if fence and token < tonumber(fence) then
  return {0, fence}
end
if not fence or token > tonumber(fence) then
  redis.call('HSET', record, 'fence', ARGV[2])
end
if not bound and agent ~= '' then
  redis.call('HSET', record, 'agent', agent)
  bound = agent
end
return {1, bound or ''}
