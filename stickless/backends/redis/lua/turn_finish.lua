-- The finish of a turn (HotPath.finish).
-- KEYS: reservation hash, record hash, transcript list, the session's dead-letter hash, pending
-- ids, pending entries, the stale index, the holder's reservation index, the dead-letter index,
-- the event stream, the session's recent relay batches.
-- ARGV: holder, turn, state (DONE or FAILED), outcome, primary ttl, the attempt that answers
-- ('' for a turn that never started), dead letter id ('' for none), packed letter, pending
-- token ('' for none), pending message id, channel ('' for no announcement), message, the
-- reservation's index member, commit token ('' for none), the number of packed entries, the
-- packed entries, the number of frames, then (with frames) relay_batch's seven arguments and
-- the encoded frames.
-- Records the outcome, appends the turn's entries under the token, keeps the dead letter,
-- acknowledges the message's pending entry, logs and publishes the turn's last frames as one
-- relay batch, then publishes the announcement, in one step: only if the reservation is
-- IN_FLIGHT for that turn, held by holder or nobody, and the token is not older than the
-- record's fence; an attempt's answer only while the holder holds that attempt.
-- Safe to run twice: a run that finds its own outcome already recorded for the turn reports
-- success with the frames' ids, acknowledges again (a no-op) and logs and publishes nothing
-- (the first run did).
-- Reply: {1, the transcript's version after the commit ('' for none), frame ids...} recorded,
-- {0[, reservation reply]} refused (not this turn's in-flight reservation; the reply is absent
-- when there is none), {2, fence} fenced out. The version is kept in the reservation ('ver'),
-- so the same call run again answers it too.
local t = now()
local r = load_reservation(KEYS[1], t)
local entries = tonumber(ARGV[15])
local frames_at = 16 + entries
local frames = tonumber(ARGV[frames_at])
local relay = argv_slice(frames_at + 1, 7)
-- Index upkeep, outside the session's slot (the bundle needs one Redis server: see _keys.py):
-- a finished instance leaves the stale and holder indexes, a refused one is made due in the
-- stale index for the scan to verify, a letter's id joins the dead-letter index (0: not
-- settled yet).
local function upkeep(recorded)
  redis.call('SREM', KEYS[8], ARGV[13])
  if recorded then
    redis.call('ZREM', KEYS[7], ARGV[13])
  else
    redis.call('ZADD', KEYS[7], 0, ARGV[13])
  end
  if ARGV[7] ~= '' then
    redis.call('ZADD', KEYS[9], 'NX', 0, ARGV[7])
  end
end
local function ack()
  if ARGV[9] ~= '' then
    ack_pending(KEYS[5], KEYS[6], ARGV[9], ARGV[10])
  end
end
-- The same call run again (a retry after a lost reply) finds its own outcome: recorded.
if r and r.turn == ARGV[2] and r.state ~= 'IN_FLIGHT' and r.outcome == ARGV[4] then
  ack()
  upkeep(true)
  local ids = frames > 0 and known_batch(KEYS[11], relay[4]) or {}
  table.insert(ids, 1, r.ver or '')
  table.insert(ids, 1, 1)
  return ids
end
-- A fenced-out commit is reported next: its holder has lost the session and must know (it
-- acknowledges nothing: the turn is answered again, as lost, and acknowledged then).
if ARGV[14] ~= '' then
  local fence = redis.call('HGET', KEYS[2], 'fence')
  if not fence or tonumber(ARGV[14]) < tonumber(fence) then
    upkeep(false)
    return {2, fence or ''}
  end
end
if not r or r.turn ~= ARGV[2] or r.state ~= 'IN_FLIGHT' or (r.holder and r.holder ~= ARGV[1])
    or (ARGV[6] ~= '' and (not r.holder or held_attempt(r) ~= tonumber(ARGV[6]))) then
  -- The message leaves the pending set unless its turn goes on: run by another attempt, or
  -- given back to run again from this very copy.
  if not (r and r.turn == ARGV[2] and not r.outcome) then
    ack()
  end
  upkeep(false)
  if r then
    return {0, reservation_reply(r, t)}
  end
  return {0}
end
local exp_at = t + tonumber(ARGV[5])
local recorded = {'state', ARGV[3], 'outcome', ARGV[4], 'touched', fmt(t), 'exp', fmt(exp_at)}
local version = ''
if ARGV[14] ~= '' then
  -- The transcript's length is its version: the last RPUSH answers it (LLEN for no entries).
  local batch = 1000
  for first = 16, frames_at - 1, batch do
    version = redis.call('RPUSH', KEYS[3],
      unpack(ARGV, first, math.min(first + batch - 1, frames_at - 1)))
  end
  if entries == 0 then
    version = redis.call('LLEN', KEYS[3])
  end
  table.insert(recorded, 'ver')
  table.insert(recorded, version)
end
redis.call('HSET', KEYS[1], unpack(recorded))
expire_at(KEYS[1], exp_at)
if ARGV[7] ~= '' and redis.call('HEXISTS', KEYS[4], ARGV[7]) == 0 then
  redis.call('HSET', KEYS[4], ARGV[7], letter_stamp(ARGV[8], t))
end
ack()
upkeep(true)
local ids = {}
if frames > 0 then
  ids = relay_batch(KEYS[10], KEYS[11], relay, argv_slice(frames_at + 8, frames))
end
if ARGV[11] ~= '' then
  redis.call('PUBLISH', ARGV[11], ARGV[12])
end
table.insert(ids, 1, version)
table.insert(ids, 1, 1)
return ids
