-- KEYS: reservation hash, pending ids, the stale index, the taker's reservation index.
-- ARGV: holder, secondary ttl, turn id, the message's pending id ('' for none), attempt below
-- which a stale holder's attempt is run again (0: never), the reservation's index member, ms
-- the taker's index lives.
-- Whatever the answer, the index entry is made due at once (the scan rescores it; the score
-- always moves, see lower_member, so a sweep that read the holderless reservation just before
-- cannot rescore it to the holderless deadline afterwards) and joins the taker's index (a
-- superset: `expire_holder` drops it when the take-over was refused).
-- Takes a holderless IN_FLIGHT reservation made for that turn as its next attempt (a rerun after
-- a lost reply finds it taken by this holder: the same attempt), or, with ARGV[5], one held by
-- a dead incarnation; it is then held under the taker's live incarnation.
-- Reply: {attempt, turn, stale deadline, attempt lost, its holder} when taken; {0, seconds to wait,
-- 1 when a holder's attempt is waited for} when it may be taken later (a retry's backoff, a
-- holder not stale yet); {0} when refused.
local function take()
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.state ~= 'IN_FLIGHT' or r.turn ~= ARGV[3] then
  return {0}
end
-- Held by this very holder: the same call made again, unless under an incarnation that ended
-- (a turn reserved before a pause: its hold is a dead one, taken over like any other).
if r.holder == ARGV[1] and holder_alive(r.holder, r.inc) then
  return {held_attempt(r), r.turn, r.stale, 0, ''}
end
local lost, lost_by = 0, ''
if not r.holder then
  if r.due > t then
    return {0, fmt(r.due - t)}
  end
elseif may_run_again(r, KEYS[2], tonumber(ARGV[5])) then
  if holder_alive(r.holder, r.inc) then
    -- ask again once the holder's liveness would have run out unrenewed
    return {0, fmt(math.max(tonumber(live_until(r.holder, t)) - t, 0.001)), 1}
  end
  lost, lost_by = give_up_attempt(KEYS[1], r, 'holder stopped answering', t, 'lost'), r.holder
else
  return {0}
end
local attempt = r.attempt + 1
local stale = fmt(t + tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'inc', redis.call('GET', live_key(ARGV[1])) or '',
  'touched', fmt(t), 'stale', stale, 'attempt', attempt, 'due', '0')
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'pending', ARGV[4])
end
return {attempt, r.turn, stale, lost, lost_by}
end
local reply = take()
lower_member(KEYS[3], ARGV[6])
hold_member(KEYS[4], ARGV[6], ARGV[7])
return reply
