-- Shared by the admission and charge scripts (put in front of each when
-- the daemon loads them): the server's clock, and one token taken from a
-- caller's rate bucket.

-- Milliseconds, by the server's clock: replicas whose clocks differ still
-- agree on lease expiry, the bucket and the UTC day.
local function server_time()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), tonumber(t[1])
end

-- Refills the bucket (hash: tokens, at) for the time since it was last
-- touched and takes one token; false, with nothing written, if there is
-- none. A clock that went back refills nothing.
local function take_token(key, now, rate, burst)
  local b = redis.call('HMGET', key, 'tokens', 'at')
  local tokens = tonumber(b[1]) or burst
  local at = tonumber(b[2]) or now
  if now > at then
    tokens = math.min(burst, tokens + (now - at) * rate / 60000)
    at = now
  end
  if tokens < 1 then
    return false
  end
  redis.call('HSET', key, 'tokens', tostring(tokens - 1), 'at', tostring(at))
  -- Idle long enough to be full again, the bucket is the same as none.
  redis.call('PEXPIRE', key, math.ceil(burst * 60000 / rate) + 1000)
  return true
end

