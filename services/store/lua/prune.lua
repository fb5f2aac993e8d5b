-- KEYS: index, active, pinned, history, plan key prefix, summary key prefix. ARGV: keep
local old = redis.call('ZREVRANGE', KEYS[1], tonumber(ARGV[1]), -1)
if #old == 0 then return 0 end
local protect = {}
protect[redis.call('GET', KEYS[2]) or '0'] = true
protect[redis.call('GET', KEYS[3]) or '0'] = true
for _, row in ipairs(redis.call('LRANGE', KEYS[4], 0, -1)) do
  local h = cjson.decode(row)
  protect[tostring(h['version'])] = true
  protect[tostring(h['previous'])] = true
end
local n = 0
for _, v in ipairs(old) do
  if not protect[v] then
    redis.call('DEL', KEYS[5] .. v, KEYS[6] .. v)
    redis.call('ZREM', KEYS[1], v)
    n = n + 1
  end
end
return n
