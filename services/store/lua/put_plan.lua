-- KEYS: plan, summary, index, seq.  ARGV: version, plan json, summary json.
if redis.call('SET', KEYS[1], ARGV[2], 'NX') == false then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[1], ARGV[1])
if tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[4], ARGV[1])
end
return 1
