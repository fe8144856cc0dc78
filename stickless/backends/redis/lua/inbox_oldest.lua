-- KEYS: the session's tier streams, its pending ids, its lease hash.
-- Reply: {now, arrival time of the oldest entry a holder should collect, or ''}. Queued
-- entries always count; pending ones (collected, not yet acknowledged) count only while no
-- lease is live, for then the holder that collected them is gone and nobody will run them
-- unless the session is claimed. Pending entries under a live lease answer `now`, so the scan
-- looks at them again later instead of dropping the session from the index.
local t = now()
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
if oldest == '' and redis.call('EXISTS', KEYS[4]) == 1 then
  if live_lease(KEYS[5], t) then
    oldest = fmt(t)
  else
    oldest = '0'
  end
end
return {fmt(t), oldest}
