-- KEYS: event stream. ARGV: bound, cursor ('' to read from the oldest frame), count.
-- Reply: {0, entries} after the cursor; {1, oldest retained id or '', last id} when frames after
-- the cursor were dropped; {2, last id} when the cursor is later than every id the log gave;
-- {3} when there is no log at all (never written, or expired) and a cursor was given.
-- Entries beyond the bound (a stream written before exact trimming, or under a larger bound)
-- count as dropped, so readers see at most `bound` frames.
local floor = nil
local excess = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 then
  local hidden = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess)
  floor = hidden[#hidden][1]
end
local first = '-'
if floor then
  first = '(' .. floor
end
local cursor = ARGV[2]
if cursor == '' then
  return {0, redis.call('XRANGE', KEYS[1], first, '+', 'COUNT', ARGV[3])}
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {3}
end
local info = stream_info(KEYS[1])
local last = info['last-generated-id']
local dropped = info['max-deleted-entry-id'] or '0-0'
if floor and compare_ids(floor, dropped) > 0 then
  dropped = floor
end
if compare_ids(cursor, last) > 0 then
  return {2, last}
end
if compare_ids(cursor, dropped) < 0 then
  local oldest = redis.call('XRANGE', KEYS[1], first, '+', 'COUNT', 1)
  if #oldest > 0 then
    return {1, oldest[1][1], last}
  end
  return {1, '', last}
end
return {0, redis.call('XRANGE', KEYS[1], '(' .. cursor, '+', 'COUNT', ARGV[3])}
