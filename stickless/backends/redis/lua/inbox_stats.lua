-- KEYS: the session's tier streams (NOW, NEXT, LATER), its pending ids (sorted set by lease
-- token) and its pending entries (hash: message id -> packed {envelope, arrival, taken}).
-- Reply: {now, entries queued in the tiers, entries pending, when the oldest pending entry was
-- last moved under a token ('' when none)}. An entry packed before `taken` existed counts from
-- its arrival (never younger than it really is); one whose payload is gone counts as pending
-- but has no time.
local queued = 0
for i = 1, 3 do
  queued = queued + redis.call('XLEN', KEYS[i])
end
local oldest = nil
for _, packed in ipairs(redis.call('HVALS', KEYS[5])) do
  local entry = cmsgpack.unpack(packed)
  local taken = tonumber(entry[3]) or tonumber(entry[2])
  if taken and (oldest == nil or taken < oldest) then
    oldest = taken
  end
end
return {fmt(now()), queued, redis.call('ZCARD', KEYS[4]), oldest and fmt(oldest) or ''}
