-- KEYS: mode, active, events, lease.  ARGV: mode, reason, now, token ("" = none)
if ARGV[4] ~= '' and redis.call('HGET', KEYS[4], 'token') ~= ARGV[4] then return 'fenced' end
local old = redis.call('HGET', KEYS[1], 'mode') or 'planned'
redis.call('HSET', KEYS[1], 'mode', ARGV[1], 'reason', ARGV[2], 'at', ARGV[3])
if old ~= ARGV[1] then
  local active = tonumber(redis.call('GET', KEYS[2]) or '0')
  redis.call('PUBLISH', KEYS[3], cjson.encode({event = 'mode', active_version = active,
    mode = ARGV[1], at = tonumber(ARGV[3])}))
end
return 'ok'
