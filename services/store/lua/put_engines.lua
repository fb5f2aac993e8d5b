-- KEYS: engines, lease.  ARGV: expected version, new version, set (JSON), token ("" = none)
-- The engine set's compare-and-set: written only when the stored version is the expected one.
if ARGV[4] ~= '' and redis.call('HGET', KEYS[2], 'token') ~= ARGV[4] then return {'fenced', 0} end
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if current ~= tonumber(ARGV[1]) then return {'stale', current} end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'set', ARGV[3])
return {'ok', tonumber(ARGV[2])}
