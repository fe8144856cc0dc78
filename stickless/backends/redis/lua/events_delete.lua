-- KEYS: event stream. ARGV: ttl (ms).
-- Empties the stream but keeps it, its last id marked dropped, as a tombstone that expires
-- `ttl` from now: ids never go back while it lives and older cursors read as trimmed.
-- Reply: 1 when there was a log, 0 otherwise.
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
local last = stream_info(KEYS[1])['last-generated-id']
redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)
redis.call('XSETID', KEYS[1], last, 'MAXDELETEDID', last)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
