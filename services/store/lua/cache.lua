-- KEYS: seen, bucket, total.  ARGV: ttl, dedup, then (field, delta) pairs.
local ttl = tonumber(ARGV[1])
if ARGV[2] == '1' then
  if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then return 0 end
end
for i = 3, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('EXPIRE', KEYS[2], ttl)
return 1
