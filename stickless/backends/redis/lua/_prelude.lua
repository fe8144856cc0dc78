-- Helpers prepended to every stickless script. Times are seconds (server clock), stored as
-- '%.6f' strings so every reader parses the very same value.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function fmt(seconds)
  return string.format('%.6f', seconds)
end

local function expire_at(key, seconds)
  redis.call('PEXPIREAT', key, string.format('%.0f', math.ceil(seconds * 1000)))
end

-- The next fencing token of a counter, as an integer string: one above the last token, and
-- never below the server clock in microseconds. The clock floor is what keeps tokens from going
-- back when the counter does: a counter that expired, was lost with a restarted server, or lost
-- its last increments in a failover to a replica that had not received them (the promoted
-- server's clock is past every token the old primary issued before the seconds a failover
-- takes, given clocks that agree to within that), so a stale holder stays fenced out. Tokens
-- stay below 2^53, exact in Lua, until the year 2255.
local function next_token(key)
  local t = redis.call('TIME')
  local clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local token = math.max(tonumber(redis.call('GET', key) or '0') + 1, clock)
  local text = string.format('%.0f', token)
  redis.call('SET', key, text, 'KEEPTTL')
  return text
end

-- Expire a token counter `token_ttl` after a lease expiring at `lease_exp` (no-op when nil).
local function keep_counter(key, lease_exp, token_ttl)
  if token_ttl then
    expire_at(key, lease_exp + token_ttl)
  end
end

-- The namespace's prefix of liveness keys: every call passes it as its last key (see
-- _scripts.Script).
local LIVE_PREFIX = KEYS[#KEYS]

-- The liveness key of a holder: a string naming its live incarnation.
local function live_key(holder)
  return LIVE_PREFIX .. holder
end

-- True when `holder` is alive as incarnation `inc` (its liveness key lives and names it).
local function holder_alive(holder, inc)
  return inc ~= nil and inc ~= false and inc ~= '' and
    redis.call('GET', live_key(holder)) == inc
end

-- When `holder`'s liveness ends unless renewed, as a '%.6f' string (now when it has none).
local function live_until(holder, t)
  local ms = redis.call('PEXPIRETIME', live_key(holder))
  if ms < 0 then
    return fmt(t)
  end
  return fmt(ms / 1000)
end

-- The valid lease {holder, token, exp} of a lease hash (its holder's incarnation alive), or nil.
local function live_lease(key, t)
  local cur = redis.call('HMGET', key, 'holder', 'token', 'inc')
  if cur[1] and holder_alive(cur[1], cur[3]) then
    return {cur[1], cur[2], live_until(cur[1], t)}
  end
  return nil
end

-- A reservation hash as a table, or nil when missing or past its primary TTL.
local function load_reservation(key, t)
  local v = redis.call('HMGET', key, 'turn', 'hash', 'holder', 'state', 'touched', 'stale', 'exp',
    'outcome', 'attempt', 'history', 'pending', 'due', 'given', 'inc', 'tp', 'ver')
  if not v[4] or tonumber(v[7]) <= t then
    return nil
  end
  return {turn = v[1], hash = v[2], holder = v[3], state = v[4], touched = v[5], stale = v[6],
    outcome = v[8], attempt = tonumber(v[9] or '0'), history = v[10], pending = v[11],
    due = tonumber(v[12] or '0'), given = v[13], inc = v[14], tp = v[15], ver = v[16]}
end

-- The number of a reservation's held attempt: one run by its submitter is 1 without a write.
local function held_attempt(r)
  return math.max(r.attempt, 1)
end

-- True when the held attempt of r is below `below` and its message is still pending.
local function may_run_again(r, pending_ids, below)
  return held_attempt(r) < below and r.pending and
    redis.call('ZSCORE', pending_ids, r.pending) ~= false
end

-- Record r's held attempt in its history as given up ({attempt, node, reason, at}), and how
-- ('lost' with its holder, or 'retry' after it failed: a rerun of one call must not take the
-- other's write for its own); its number.
local function give_up_attempt(key, r, reason, t, how)
  local history = {}
  if r.history then
    history = cmsgpack.unpack(r.history)
  end
  local lost = held_attempt(r)
  table.insert(history, {lost, r.holder or '', reason, fmt(t)})
  r.history = cmsgpack.pack(history)
  r.attempt = lost
  redis.call('HSET', key, 'attempt', lost, 'history', r.history, 'given', how)
  return lost
end

-- The last history entry of r as {attempt, node}, or nil.
local function last_attempt(r)
  if not r.history then
    return nil
  end
  local history = cmsgpack.unpack(r.history)
  return history[#history]
end

-- True when an IN_FLIGHT reservation is abandoned: held by a dead incarnation, or holderless
-- past its bound.
local function is_stale(r, t)
  if r.state ~= 'IN_FLIGHT' then
    return false
  end
  if r.holder then
    return not holder_alive(r.holder, r.inc)
  end
  return t > tonumber(r.stale)
end

-- The flat reply every reservation read returns (see _idempotency._reservation).
local function reservation_reply(r, t)
  local stale = 0
  if is_stale(r, t) then
    stale = 1
  end
  local has_holder = 0
  if r.holder then
    has_holder = 1
  end
  return {r.turn, r.hash, has_holder, r.holder or '', r.state, r.touched, stale, r.outcome or '',
    r.stale, r.attempt, r.history or '', r.pending or '', r.tp or ''}
end

-- XINFO STREAM of a stream as a table of its fields ('last-generated-id', ...).
local function stream_info(key)
  local info = redis.call('XINFO', 'STREAM', key)
  local fields = {}
  for i = 1, #info, 2 do
    fields[info[i]] = info[i + 1]
  end
  return fields
end

-- Append frames[first..] to the event stream `key` in order ('f' fields), trim it exactly to
-- the newest `bound`, record the newest dropped id as its max-deleted-entry-id (XSETID, Redis
-- >= 7.0) so reads can tell a trimmed cursor from one that lost nothing, and expire the whole
-- log `ttl_ms` after this append. The new ids, in order.
local function append_frames(key, bound, ttl_ms, frames, first)
  local ids = {}
  for i = first, #frames do
    ids[#ids + 1] = redis.call('XADD', key, '*', 'f', frames[i])
  end
  local excess = redis.call('XLEN', key) - bound
  if excess > 0 then
    local dropped = redis.call('XRANGE', key, '-', '+', 'COUNT', excess)
    redis.call('XTRIM', key, 'MAXLEN', bound)
    redis.call('XSETID', key, ids[#ids], 'MAXDELETEDID', dropped[#dropped][1])
  end
  redis.call('PEXPIRE', key, ttl_ms)
  return ids
end

-- The ids a relay batch got when it was logged before (its id among the session's recent
-- batches, the list `batches`), or nil.
local function known_batch(batches, batch_id)
  local prefix = batch_id .. ' '
  for _, known in ipairs(redis.call('LRANGE', batches, 0, -1)) do
    if string.sub(known, 1, #prefix) == prefix then
      local ids = {}
      for id in string.gmatch(string.sub(known, #prefix + 1), '%S+') do
        ids[#ids + 1] = id
      end
      return ids
    end
  end
  return nil
end

-- One relay batch (EventRelayPath.append_and_publish): unless logged before, append `frames`
-- as append_frames does, PUBLISH them on `relay.channel` as one EVENT signal, head .. frames
-- .. ids head .. each id packed (wire.pack_event_batch: the frames go out as they were logged,
-- never re-encoded), and remember the batch as "<batch id> <id> <id> ..." among the newest
-- `relay.window` (expiring with the log). `relay`: {bound, ttl (ms), window, batch id, channel,
-- head, ids head}. The ids, in order.
local function relay_batch(stream, batches, relay, frames)
  local ids = known_batch(batches, relay[4])
  if ids then
    return ids
  end
  ids = append_frames(stream, tonumber(relay[1]), relay[2], frames, 1)
  local parts = {relay[6]}
  for i = 1, #frames do
    parts[#parts + 1] = frames[i]
  end
  parts[#parts + 1] = relay[7]
  for i = 1, #ids do
    parts[#parts + 1] = cmsgpack.pack(ids[i])
  end
  redis.call('PUBLISH', relay[5], table.concat(parts))
  redis.call('LPUSH', batches, relay[4] .. ' ' .. table.concat(ids, ' '))
  redis.call('LTRIM', batches, 0, tonumber(relay[3]) - 1)
  redis.call('PEXPIRE', batches, relay[2])
  return ids
end

-- ARGV[first .. first + count - 1] as a table (without unpack's limit on results).
local function argv_slice(first, count)
  local items = {}
  for i = first, first + count - 1 do
    items[#items + 1] = ARGV[i]
  end
  return items
end

-- Compare two stream ids '<ms>-<seq>' written without leading zeros: -1, 0 or 1. Exact for any
-- 64-bit parts (compared as digit strings, never as Lua numbers).
local function compare_ids(a, b)
  local ams, aseq = string.match(a, '^(%d+)-(%d+)$')
  local bms, bseq = string.match(b, '^(%d+)-(%d+)$')
  local function digits(x, y)
    if #x ~= #y then
      return #x < #y and -1 or 1
    end
    if x == y then
      return 0
    end
    return x < y and -1 or 1
  end
  local c = digits(ams, bms)
  if c ~= 0 then
    return c
  end
  return digits(aseq, bseq)
end

-- A packed dead letter (base.pack_letter: bytes 0x93 0x01 0xcb, then dead_at as a big-endian
-- float64 in bytes 4-11) with a dead_at packed as 0 stamped `t`; anything else is returned as
-- it is.
local function letter_stamp(packed, t)
  local header = string.sub(packed, 1, 3)
  if header == '\147\1\203' and string.sub(packed, 4, 11) == string.rep('\0', 8) then
    return header .. struct.pack('>d', t) .. string.sub(packed, 12)
  end
  return packed
end

-- Acknowledge message `id` of a session's pending set (`ids`: sorted set by lease token,
-- `entries`: hash) if it is pending under lease `token` (a newer holder's is left alone);
-- 1 when it was dropped.
local function ack_pending(ids, entries, token, id)
  local score = redis.call('ZSCORE', ids, id)
  if score and tonumber(score) == tonumber(token) then
    redis.call('ZREM', ids, id)
    redis.call('HDEL', entries, id)
    return 1
  end
  return 0
end

-- Make a member of an index due at once: its score goes below both 0 and the score it had (a
-- missing member is added at -1). The score always changes, so a scan that read it before
-- cannot rescore it afterwards (index_rescore compares the score it saw): a deadline that moved
-- earlier meanwhile is never raised back to the later one the scan read. Returns the new score.
local function lower_member(index, member)
  local seen = redis.call('ZSCORE', index, member)
  local low = -1
  if seen and tonumber(seen) <= 0 then
    low = tonumber(seen) - 1
  end
  redis.call('ZADD', index, low, member)
  return tostring(low)
end

-- Add a member to a holder's index, kept alive `ms` from now (never shortened).
local function hold_member(index, member, ms)
  redis.call('SADD', index, member)
  redis.call('PEXPIRE', index, ms, 'NX')
  redis.call('PEXPIRE', index, ms, 'GT')
end
