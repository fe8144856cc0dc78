-- KEYS: the session's tier streams (NOW, NEXT, LATER), this take's key, the pending ids (sorted
-- set: message id by lease token) and the pending entries (hash: message id -> packed
-- {envelope, arrival, taken}; `taken` is when a take last moved the entry under a token, and an
-- entry written before that field existed has only the first two), the pending index, the stale
-- index and the taker's reservation index.
-- ARGV: highest tier index to take, seconds the take is remembered, lease token, highest token
-- whose pending entries are taken over too (-1: none), ms the pending set lives after a write,
-- 1 to purge (everything is removed, nothing is kept pending), the session id, the taker ('' for
-- none), its secondary ttl, the session's reservation key prefix, the session's index member
-- prefix, ms the taker's index lives.
-- With a taker, a take that brings exactly one message, fresh from the queue, also takes its
-- reservation over when it is IN_FLIGHT for that turn, holderless and due (idem_acquire's
-- plain case): the taker runs it next. Any other case is left to idem_acquire.
-- A take that leaves nothing queued or pending drops the session from the pending index (as
-- index_drop does: unless a later delivery rescored it).
-- Moves every entry of tiers 0..ARGV[1] into the pending set under the token (the streams are
-- deleted whole) together with the pending entries of tokens up to ARGV[4], stamping each with
-- the server clock. The reply is kept under this take's key, so the same call run again after a
-- lost reply answers the very same batch instead of an empty one.
-- Reply: {now, how many of the tiers and the pending set still hold entries, {message id,
-- envelope, arrival, ...}, entries taken over from older tokens, entries taken back under the
-- token itself}; a field the entry lacks (or a pending entry whose payload is gone) comes back
-- as nil, for the caller to report that entry unreadable.
local kept = redis.call('GET', KEYS[4])
if kept then
  return cmsgpack.unpack(kept)
end
local token, purge = ARGV[3], ARGV[6] == '1'
local taken = fmt(now())
local out = {}
local redelivered, reclaimed = 0, 0
local function add(id, data, arrived)
  table.insert(out, id)
  table.insert(out, data)
  table.insert(out, arrived)
end
local reclaim = tonumber(ARGV[4])
if purge or reclaim >= 0 then
  local held = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', purge and '+inf' or reclaim,
    'WITHSCORES')
  for k = 1, #held, 2 do
    local id = held[k]
    if purge then
      -- a purge answers what it removed: nothing is delivered again
    elseif tonumber(held[k + 1]) == tonumber(token) then
      reclaimed = reclaimed + 1
    else
      redelivered = redelivered + 1
    end
    local packed = redis.call('HGET', KEYS[6], id)
    if packed then
      local entry = cmsgpack.unpack(packed)
      add(id, entry[1], entry[2])
      if not purge then
        redis.call('ZADD', KEYS[5], token, id)
        redis.call('HSET', KEYS[6], id, cmsgpack.pack({entry[1], entry[2], taken}))
      end
    else
      add(id, false, false)
      redis.call('ZREM', KEYS[5], id)
    end
  end
end
local head = nil
for i = 1, tonumber(ARGV[1]) + 1 do
  local entries = redis.call('XRANGE', KEYS[i], '-', '+')
  for _, entry in ipairs(entries) do
    local fields = entry[2]
    local data, arrived, key, turn = false, false, nil, nil
    for j = 1, #fields, 2 do
      if fields[j] == 'e' then
        data = fields[j + 1]
      elseif fields[j] == 't' then
        arrived = fields[j + 1]
      elseif fields[j] == 'k' then
        key = fields[j + 1]
      elseif fields[j] == 'u' then
        turn = fields[j + 1]
      end
    end
    local id = (i - 1) .. ':' .. entry[1]
    head = {id, key, turn, data}
    add(id, data, arrived)
    if not purge then
      redis.call('ZADD', KEYS[5], token, id)
      redis.call('HSET', KEYS[6], id, cmsgpack.pack({data, arrived, taken}))
    end
  end
  if #entries > 0 then
    redis.call('DEL', KEYS[i])
  end
end
if purge then
  redis.call('DEL', KEYS[5], KEYS[6])
elseif #out > 0 then
  redis.call('PEXPIRE', KEYS[5], ARGV[5])
  redis.call('PEXPIRE', KEYS[6], ARGV[5])
end
-- The plain take-over of the batch's only message (see above): its attempt, 0 when not taken.
local function take_over(id, key, turn, data)
  -- (only an envelope that names this very turn and key: an unreadable one is not taken over)
  local ok, envelope = pcall(cmsgpack.unpack, data)
  if not ok or type(envelope) ~= 'table' or envelope.turn_id ~= turn or envelope.key ~= key then
    return 0
  end
  local t = tonumber(taken)
  local reservation = ARGV[10] .. key
  local r = load_reservation(reservation, t)
  if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= turn or r.holder or r.due > t then
    return 0
  end
  local attempt = r.attempt + 1
  redis.call('HSET', reservation, 'holder', ARGV[8], 'inc',
    redis.call('GET', live_key(ARGV[8])) or '', 'touched', taken,
    'stale', fmt(t + tonumber(ARGV[9])), 'attempt', attempt, 'due', '0', 'pending', id)
  local member = ARGV[11] .. #key .. ':' .. key .. turn
  lower_member(KEYS[8], member)
  hold_member(KEYS[9], member, ARGV[12])
  return attempt
end
local attempt = 0
if ARGV[8] ~= '' and not purge and #out == 3 and head and head[2] and head[2] ~= '' and
    head[4] then
  attempt = take_over(head[1], head[2], head[3], head[4])
end
local remaining = redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[5])
if (#out > 0 or purge) and remaining == 0 then
  local score = redis.call('ZSCORE', KEYS[7], ARGV[7])
  if score and tonumber(score) <= tonumber(taken) then
    redis.call('ZREM', KEYS[7], ARGV[7])
  end
end
local reply = {taken, remaining, out, redelivered, reclaimed, attempt}
if #out > 0 then
  redis.call('SET', KEYS[4], cmsgpack.pack(reply), 'EX', ARGV[2])
end
return reply
