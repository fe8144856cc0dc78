-- KEYS: the session's tier streams. ARGV: highest tier index to take.
-- Removes every entry of tiers 0..ARGV[1] at once (the streams are deleted whole).
-- Reply: {now, tiers still holding entries, {tier, id, envelope, arrival, ...}}; a field the
-- entry lacks comes back as nil, for the caller to report that entry unreadable.
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
return {fmt(now()), redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3]), out}
