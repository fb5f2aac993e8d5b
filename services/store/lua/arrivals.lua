-- One bucket's share of several batches, all or nothing.
-- KEYS: n, pt, xt, gaps, log, v, untracked, sealed_keys, then the seen marker of every deduplicated
-- batch part.
-- ARGV: ttl, gap_cap, log_cap, counts (JSON array: key, n, prompt, prefix, ... as strings,
-- summed over the parts), gaps and log records (each newline-separated, only the newest cap),
-- a fresh random token for v, the bucket's key cap (0: none).
-- A key new to the bucket once it holds `cap` keys is counted in the untracked hash only
-- (fields n, pt, xt): the bucket's size is bounded whatever callers send. A sealed bucket
-- (seal.lua) counts its sealed keys too; a late arrival of a sealed key counts as a new key
-- there (conservative: the bound holds, such a key may go untracked once the bucket is full).
-- Returns {} when written, else the 1-based positions of the markers already set (nothing
-- written; the caller retries without those parts).
local ttl = tonumber(ARGV[1])
local seen = {}
for k = 9, #KEYS do
  if redis.call('EXISTS', KEYS[k]) == 1 then seen[#seen + 1] = k - 8 end
end
if #seen > 0 then return seen end
for k = 9, #KEYS do redis.call('SET', KEYS[k], '1', 'EX', ttl) end
redis.call('SET', KEYS[6], ARGV[7], 'EX', ttl)
local c = cjson.decode(ARGV[4])
local cap = tonumber(ARGV[8])
local have = 0
if cap > 0 then have = redis.call('HLEN', KEYS[1]) + tonumber(redis.call('GET', KEYS[8]) or '0') end
local over = {0, 0, 0}
for i = 1, #c, 4 do
  local tracked = true
  if cap > 0 and redis.call('HEXISTS', KEYS[1], c[i]) == 0 then
    if have < cap then have = have + 1 else tracked = false end
  end
  if tracked then
    redis.call('HINCRBY', KEYS[1], c[i], c[i + 1])
    redis.call('HINCRBY', KEYS[2], c[i], c[i + 2])
    redis.call('HINCRBY', KEYS[3], c[i], c[i + 3])
  else
    for j = 1, 3 do over[j] = over[j] + tonumber(c[i + j]) end
  end
end
if over[1] > 0 then
  redis.call('HINCRBY', KEYS[7], 'n', over[1])
  redis.call('HINCRBY', KEYS[7], 'pt', over[2])
  redis.call('HINCRBY', KEYS[7], 'xt', over[3])
  redis.call('EXPIRE', KEYS[7], ttl)
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
