-- KEYS: seen, bucket.  ARGV: ttl, dedup, cap, then (field, count) pairs.
-- Prefix-node counts of one telemetry bucket; a bucket holds at most `cap` fields (new fields
-- beyond it are dropped, existing ones still count), so junk chains cannot grow it unbounded.
local ttl = tonumber(ARGV[1])
local cap = tonumber(ARGV[3])
if ARGV[2] == '1' then
  if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then return 0 end
end
local size = redis.call('HLEN', KEYS[2])
for i = 4, #ARGV, 2 do
  if size < cap or redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then
    local n = tonumber(ARGV[i + 1])
    if redis.call('HINCRBY', KEYS[2], ARGV[i], n) == n then size = size + 1 end
  end
end
redis.call('EXPIRE', KEYS[2], ttl)
return 1
