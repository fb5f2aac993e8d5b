-- KEYS: seen, bucket, total.  ARGV: ttl, dedup, limit, then (replica, prompt, cached, requests,
-- completed, completion tokens) groups of deltas. A replica whose lifetime totals would pass
-- `limit` (2^62, far below HINCRBY's int64 overflow; doubles are exact enough at that size) is
-- skipped whole. Returns {0} for a duplicate batch (nothing written), else {1, skipped replica ids...}.
local ttl = tonumber(ARGV[1])
local limit = tonumber(ARGV[3])
if ARGV[2] == '1' then
  if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then return {0} end
end
local kinds = {'p', 'c', 'r', 'f', 'o'}
local n = #kinds
local refused = {}
for i = 4, #ARGV, n + 1 do
  local ok = true
  for j = 1, n do
    local current = tonumber(redis.call('HGET', KEYS[3], ARGV[i] .. '|' .. kinds[j]) or '0')
    if current + tonumber(ARGV[i + j]) > limit then ok = false end
  end
  if ok then
    for j = 1, n do
      -- a zero delta of the output counters writes nothing (reporters that cannot tell send 0)
      if j <= 3 or ARGV[i + j] ~= '0' then
        local field = ARGV[i] .. '|' .. kinds[j]
        redis.call('HINCRBY', KEYS[2], field, ARGV[i + j])
        redis.call('HINCRBY', KEYS[3], field, ARGV[i + j])
      end
    end
  else
    refused[#refused + 1] = ARGV[i]
  end
end
redis.call('EXPIRE', KEYS[2], ttl)
return {1, unpack(refused)}
