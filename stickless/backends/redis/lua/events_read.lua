-- KEYS: event stream. ARGV: bound, start ('-' or '(' .. id), count.
-- Approximate MAXLEN trimming may keep a few entries beyond the bound; they are skipped here
-- so readers see at most `bound` frames.
local start = ARGV[2]
local excess = redis.call('XLEN', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 then
  local dropped = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', excess)
  local floor = dropped[#dropped][1]
  local function parts(id)
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
  end
  local fms, fseq = parts(floor)
  if start == '-' then
    start = '(' .. floor
  else
    local ams, aseq = parts(string.sub(start, 2))
    if ams < fms or (ams == fms and aseq < fseq) then
      start = '(' .. floor
    end
  end
end
return redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', ARGV[3])
