-- KEYS: reservation hash. ARGV: 1 when a holder is expected (0: holderless), holder, outcome,
-- the outcome's turn id, state (FAILED, or DONE for a final outcome), 1 when no attempt of the
-- turn may have started (a "not run" answer). Records the outcome if IN_FLIGHT for that turn,
-- held as expected (and never started, when asked).
-- Reply: {1, turn} when reset, else {0}.
local t = now()
local r = load_reservation(KEYS[1], t)
if not r or r.turn ~= ARGV[4] then
  return {0}
end
if r.state ~= 'IN_FLIGHT' then
  -- The same call run again after a lost reply finds its own outcome: it still won.
  if r.outcome == ARGV[3] then
    return {1, r.turn}
  end
  return {0}
end
if ARGV[1] == '1' then
  if r.holder ~= ARGV[2] then
    return {0}
  end
elseif r.holder then
  return {0}
end
if ARGV[6] == '1' and (r.attempt > 0 or r.history) then
  return {0}
end
redis.call('HSET', KEYS[1], 'state', ARGV[5], 'outcome', ARGV[3], 'touched', fmt(t))
return {1, r.turn}
