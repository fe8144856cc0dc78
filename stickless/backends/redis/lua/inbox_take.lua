-- KEYS: the session's tier streams, this take's key. ARGV: highest tier index to take, seconds
-- the take is remembered.
-- Removes every entry of tiers 0..ARGV[1] at once (the streams are deleted whole). The reply is
-- kept under this take's key, so the same call run again after a lost reply answers the very
-- same batch instead of an empty one.
-- Reply: {now, tiers still holding entries, {tier, id, envelope, arrival, ...}}; a field the
-- entry lacks comes back as nil, for the caller to report that entry unreadable.
local kept = redis.call('GET', KEYS[4])
if kept then
  return cmsgpack.unpack(kept)
end
local out = {}
for i = 1, tonumber(ARGV[1]) + 1 do
  local entries = redis.call('XRANGE', KEYS[i], '-', '+')
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    local data, arrived = false, false
    for j = 1, #fields, 2 do
      if fields[j] == 'e' then
        data = fields[j + 1]
      elseif fields[j] == 't' then
        arrived = fields[j + 1]
      end
    end
    table.insert(out, i - 1)
    table.insert(out, entry[1])
    table.insert(out, data)
    table.insert(out, arrived)
  end
  if #entries > 0 then
    redis.call('DEL', KEYS[i])
  end
end
local reply = {fmt(now()), redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]), out}
if #out > 0 then
  redis.call('SET', KEYS[4], cmsgpack.pack(reply), 'EX', ARGV[2])
end
return reply
