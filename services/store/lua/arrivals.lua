-- One bucket's share of several batches, all or nothing.
-- KEYS: n, pt, xt, gaps, log, v, then the seen marker of every deduplicated batch part.
-- ARGV: ttl, gap_cap, log_cap, counts (JSON array: key, n, prompt, prefix, ... as strings,
-- summed over the parts), gaps and log records (each newline-separated, only the newest cap),
-- a fresh random token for v.
-- Returns {} when written, else the 1-based positions of the markers already set (nothing
-- written; the caller retries without those parts).
local ttl = tonumber(ARGV[1])
local seen = {}
for k = 7, #KEYS do
  if redis.call('EXISTS', KEYS[k]) == 1 then seen[#seen + 1] = k - 6 end
end
if #seen > 0 then return seen end
for k = 7, #KEYS do redis.call('SET', KEYS[k], '1', 'EX', ttl) end
redis.call('SET', KEYS[6], ARGV[7], 'EX', ttl)
local c = cjson.decode(ARGV[4])
for i = 1, #c, 4 do
  redis.call('HINCRBY', KEYS[1], c[i], c[i + 1])
  redis.call('HINCRBY', KEYS[2], c[i], c[i + 2])
  redis.call('HINCRBY', KEYS[3], c[i], c[i + 3])
end
local function push(key, blob, cap)
  if cap <= 0 or blob == '' then return end
  local items = {}
  for item in string.gmatch(blob, '[^\n]+') do
    items[#items + 1] = item
    if #items == 1000 then redis.call('RPUSH', key, unpack(items)); items = {} end
  end
  if #items > 0 then redis.call('RPUSH', key, unpack(items)) end
  redis.call('LTRIM', key, -cap, -1)
  redis.call('EXPIRE', key, ttl)
end
push(KEYS[4], ARGV[5], tonumber(ARGV[2]))
push(KEYS[5], ARGV[6], tonumber(ARGV[3]))
for k = 1, 3 do redis.call('EXPIRE', KEYS[k], ttl) end
return {}
