-- KEYS: pinned, lease.  ARGV: token ("" = none)
if ARGV[1] ~= '' and redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then return 'fenced' end
redis.call('DEL', KEYS[1])
return 'ok'
