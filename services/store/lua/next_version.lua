-- A new version number that never goes below what this client has seen (ARGV[1]), so a store
-- that lost its data (Redis restarted without persistence) cannot hand out a reused version.
-- KEYS: seq.  ARGV: highest version the caller has seen.  Returns {version, counter before}.
local before = tonumber(redis.call('GET', KEYS[1]) or '0')
local v = math.max(before, tonumber(ARGV[1])) + 1
redis.call('SET', KEYS[1], v)
return {v, before}
