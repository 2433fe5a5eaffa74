-- A replica's live leases pushed forward: each stays only while the replica
-- that holds it keeps renewing it.
--
-- KEYS: the lease sets, one per lease; ARGV: 1 lease ms, then the lease ids
-- in the order of KEYS. A lease that expired and was dropped while this
-- replica could not reach the store is put back: its run is still going,
-- and a run going on uncounted is what the leases exist to prevent.
-- Returns how many leases had to be put back.
-- (bucket.lua comes first: server_time.)
local now = server_time()
local lease_ms = tonumber(ARGV[1])
local restored = 0
for i, key in ipairs(KEYS) do
  restored = restored + redis.call('ZADD', key, now + lease_ms, ARGV[i + 1])
  redis.call('PEXPIRE', key, lease_ms * 2)
end
return restored
