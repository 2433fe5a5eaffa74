-- Joins a replica to the holders of an owner's sessions, if no other
-- replica holds any of them.
-- (bucket.lua comes first: server_time.)
--
-- KEYS: 1 the owner's sessions (sorted set: "<place id> <holder>" -> expiry, ms)
-- ARGV: 1 the new member, 2 lease ms, 3 this replica's holder string
-- Returns '' when joined, else the holder string of another replica.
local now = server_time()
local lease_ms = tonumber(ARGV[2])
-- A member past its expiry belongs to a replica that stopped renewing it.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local space = string.find(member, ' ', 1, true)
  local holder = space and string.sub(member, space + 1) or ''
  -- Never '' (that answer means joined): a malformed member is reported
  -- as a holder no replica signed.
  if holder == '' then
    holder = '?'
  end
  if holder ~= ARGV[3] then
    return holder
  end
end
redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
redis.call('PEXPIRE', KEYS[1], lease_ms * 2)
return ''
