-- KEYS: lease.  ARGV: holder, token, ttl_ms ("" = release)
if redis.call('HGET', KEYS[1], 'holder') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'token') ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then redis.call('DEL', KEYS[1]) else redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return 1
