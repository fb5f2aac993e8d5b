-- Seal a closed telemetry bucket: its three count hashes become one blob (services/store/keys.py,
-- seal_blob) written by a window read from what it just read under write token ARGV[1]. Only if
-- no write came since (the token is unchanged), so the blob holds exactly the hashes' counts plus
-- any earlier blob's. The token stays: a reader's cache of the bucket stays valid. Late arrivals
-- after sealing go to fresh hashes (a delta the next read folds into a new blob).
-- KEYS: v, n, pt, xt, sealed, sealed_keys.  ARGV: token, blob, key count.
-- Returns 1 when sealed, 0 when a write raced the read (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -1 then             -- a bucket written without expiry (not by this store) keeps none
  redis.call('SET', KEYS[5], ARGV[2])
  redis.call('SET', KEYS[6], ARGV[3])
elseif ttl > 0 then
  redis.call('SET', KEYS[5], ARGV[2], 'PX', ttl)
  redis.call('SET', KEYS[6], ARGV[3], 'PX', ttl)
else
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
return 1
