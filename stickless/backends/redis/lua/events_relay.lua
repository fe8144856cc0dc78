-- KEYS: event stream, the session's recent relay batches (a list).
-- ARGV: bound, ttl (ms), batch window, batch id, event channel, signal head, ids head,
-- encoded frames...
-- One relay batch: appends the frames as events_append does, then PUBLISHes them on the
-- session's event channel as one EVENT signal, head .. frames .. ids head .. each id packed
-- (wire.pack_event_batch), so the frames go out as they were logged, never re-encoded.
-- The batch is remembered as "<batch id> <id> <id> ..." among the session's newest `window`
-- batches (expiring with the log): the same call run again (redis-py resends it after a lost
-- reply) appends and publishes nothing and answers the first run's ids.
-- Reply: the ids, in order.
local prefix = ARGV[4] .. ' '
for _, known in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  if string.sub(known, 1, #prefix) == prefix then
    local ids = {}
    for id in string.gmatch(string.sub(known, #prefix + 1), '%S+') do
      ids[#ids + 1] = id
    end
    return ids
  end
end
local ids = append_frames(KEYS[1], tonumber(ARGV[1]), ARGV[2], ARGV, 8)
local parts = {ARGV[6]}
for i = 8, #ARGV do
  parts[#parts + 1] = ARGV[i]
end
parts[#parts + 1] = ARGV[7]
for i = 1, #ids do
  parts[#parts + 1] = cmsgpack.pack(ids[i])
end
redis.call('PUBLISH', ARGV[5], table.concat(parts))
redis.call('LPUSH', KEYS[2], prefix .. table.concat(ids, ' '))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return ids
