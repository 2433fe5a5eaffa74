-- A replica's live leases pushed forward: each stays only while the replica
-- that holds it keeps renewing it.
-- (bucket.lua comes first: server_time.)
--
-- KEYS: the lease sets, one per lease; ARGV: 1 lease ms, 2 'put-back' or
-- 'existing', then the lease ids in the order of KEYS.
-- 'put-back' (runs): a lease that expired and was dropped while this
-- replica could not reach the store is put back: its run is still going,
-- and a run going on uncounted is what the leases exist to prevent.
-- 'existing' (session places): only a lease still there is renewed; one
-- dropped may have been given to another open since.
-- Returns how many leases are there now.
local now = server_time()
local lease_ms = tonumber(ARGV[1])
local put_back = ARGV[2] == 'put-back'
local there = 0
for i, key in ipairs(KEYS) do
  local id = ARGV[i + 2]
  if put_back or redis.call('ZSCORE', key, id) then
    redis.call('ZADD', key, now + lease_ms, id)
    redis.call('PEXPIRE', key, lease_ms * 2)
    there = there + 1
  end
end
return there
