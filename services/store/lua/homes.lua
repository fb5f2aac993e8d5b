-- KEYS: bucket.  ARGV: ttl, cap, then (key, replica id) pairs.
-- Where keys were served in one telemetry bucket (a key's later pair wins); a bucket holds at
-- most `cap` keys (new keys beyond it are dropped, existing ones still update).
local ttl = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local size = redis.call('HLEN', KEYS[1])
for i = 3, #ARGV, 2 do
  if size < cap or redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    if redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then size = size + 1 end
  end
end
redis.call('EXPIRE', KEYS[1], ttl)
return 1
