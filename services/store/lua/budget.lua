-- One caller's telemetry budget, a token bucket shared by every dispatcher (services/dispatcher/budget.py).
-- KEYS: the caller's bucket (hash: t = tokens, at = last refill, ms).  ARGV: n, rate (per s), burst, now_ms.
-- Returns how many of the n arrivals may be reported. A new bucket starts full; a clock behind
-- `at` (another dispatcher's) refills nothing and never moves `at` back. The key expires once the
-- bucket would be full again (plus a second), so idle callers cost nothing.
local n, rate, burst, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local row = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens, at = tonumber(row[1]), tonumber(row[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
elseif now > at then
  tokens = math.min(burst, tokens + (now - at) / 1000 * rate)
  at = now
end
local granted = math.max(0, math.min(n, math.floor(tokens)))
tokens = tokens - granted
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'at', string.format('%d', at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return granted
