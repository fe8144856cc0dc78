-- KEYS: the session's tier streams. Reply: {now, arrival time of the oldest entry or ''}.
local oldest = ''
for i = 1, 3 do
  local first = redis.call('XRANGE', KEYS[i], '-', '+', 'COUNT', 1)
  if #first > 0 then
    local fields = first[1][2]
    for j = 1, #fields, 2 do
      if fields[j] == 't' and (oldest == '' or tonumber(fields[j + 1]) < tonumber(oldest)) then
        oldest = fields[j + 1]
      end
    end
  end
end
return {fmt(now()), oldest}
