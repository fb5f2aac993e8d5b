-- KEYS: pinned, active, index, lease.  ARGV: version, token ("" = none)
if ARGV[2] ~= '' and redis.call('HGET', KEYS[4], 'token') ~= ARGV[2] then return 'fenced' end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 'missing' end
if tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[1]) then return 'not_active' end
redis.call('SET', KEYS[1], ARGV[1])
return 'ok'
