-- One of a caller's session places across the fleet, if one is free.
-- (bucket.lua comes first: server_time.)
--
-- KEYS: 1 the caller's session places (sorted set: place id -> expiry, ms)
-- ARGV: 1 place id, 2 lease ms, 3 the caller's cap
-- Returns 1 when taken, 0 at the cap.
local now = server_time()
local lease_ms = tonumber(ARGV[2])
-- A place past its expiry belongs to a replica that stopped renewing it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease_ms * 2)
return 1
