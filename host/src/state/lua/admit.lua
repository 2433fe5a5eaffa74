-- One admission, checked and booked in one step on the server, so replicas
-- never read, decide and write in between one another.
--
-- KEYS: 1 the caller's leases (sorted set: booking id -> expiry, ms),
--       2 the caller's rate bucket (hash: tokens, at),
--       3 the caller's paid seconds (hash: day, used),
--       4 the fleet's paid seconds (hash: day, used),
--       5 this booking (string: the seconds it reserved)
-- ARGV: 1 booking id, 2 lease ms,
--       3 per-caller cap (0: none, and no lease is taken),
--       4 runs per minute (0: no rate), 5 burst, 6 metered (1/0),
--       7 the caller's paid allowance (-1: none), 8 the fleet's paid cap
--       (0: none), 9 seconds to reserve
-- Returns {verdict, day}: 'ok' or the limit that refused.
-- (bucket.lua comes first: server_time, take_token.)
local now, secs = server_time()
local day = math.floor(secs / 86400)
local lease_ms = tonumber(ARGV[2])
local per_key = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local burst = tonumber(ARGV[5])
local metered = ARGV[6] == '1'
local allowance = tonumber(ARGV[7])
local fleet_cap = tonumber(ARGV[8])
local reserve = tonumber(ARGV[9])

local function used_today(key)
  local v = redis.call('HMGET', key, 'day', 'used')
  if tonumber(v[1]) == day then
    return tonumber(v[2]) or 0
  end
  return 0
end

if metered then
  if allowance >= 0 and used_today(KEYS[3]) >= allowance then
    return {'paid_caller', day}
  end
  if fleet_cap > 0 and used_today(KEYS[4]) >= fleet_cap then
    return {'paid_daemon', day}
  end
end

if per_key > 0 then
  -- A lease past its expiry belongs to a replica that stopped renewing it.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('ZCARD', KEYS[1]) >= per_key then
    return {'per_key', day}
  end
end

if rate > 0 and not take_token(KEYS[2], now, rate, burst) then
  return {'rate', day}
end

if per_key > 0 then
  redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease_ms * 2)
end

if metered and reserve > 0 then
  for i = 3, 4 do
    if tonumber(redis.call('HGET', KEYS[i], 'day')) ~= day then
      redis.call('HSET', KEYS[i], 'day', day, 'used', 0)
    end
    redis.call('HINCRBY', KEYS[i], 'used', reserve)
    -- Kept past the day it counts, then gone.
    redis.call('EXPIRE', KEYS[i], 2 * 86400)
  end
  -- What settle may refund, once: the booking is taken when refunded.
  redis.call('SET', KEYS[5], reserve, 'EX', 2 * 86400)
end
return {'ok', day}
