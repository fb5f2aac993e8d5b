-- Activation and rollback (compare-and-set on the active version). ARGV[1] = version ("0" with
-- event "rollback": the version active before the current one).
-- KEYS: active, history, lease, pinned, mode, index, events channel
-- ARGV: version, expected, token ("" = none), event, reason, now, automatic, history_max
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local version = tonumber(ARGV[1])
if current ~= tonumber(ARGV[2]) then return {'stale', current, 0} end
if version == 0 then
  local head = redis.call('LINDEX', KEYS[2], 0)
  if not head then return {'no_previous', current, 0} end
  version = tonumber(cjson.decode(head)['previous'])
  if version == 0 then return {'no_previous', current, 0} end
end
if not redis.call('ZSCORE', KEYS[6], version) then return {'missing', current, version} end
if ARGV[3] ~= '' and redis.call('HGET', KEYS[3], 'token') ~= ARGV[3] then
  return {'fenced', current, version}
end
local pinned = tonumber(redis.call('GET', KEYS[4]) or '0')
if pinned ~= 0 and pinned ~= version then return {'pinned', pinned, version} end
local mode = redis.call('HGET', KEYS[5], 'mode') or 'planned'
if ARGV[7] == '1' and mode == 'flat' then return {'flat', current, version} end
if version == current then return {'same', current, version} end
redis.call('SET', KEYS[1], version)
local token = 0
if ARGV[3] ~= '' then token = tonumber(ARGV[3]) end
redis.call('LPUSH', KEYS[2], cjson.encode({version = version, previous = current, event = ARGV[4],
  reason = ARGV[5], at = tonumber(ARGV[6]), token = token}))
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[8]) - 1)
redis.call('PUBLISH', KEYS[7], cjson.encode({event = ARGV[4], active_version = version,
  mode = mode, at = tonumber(ARGV[6])}))
return {'ok', current, version}
