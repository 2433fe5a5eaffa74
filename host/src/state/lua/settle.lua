-- The end of an admission: its lease given back and the paid seconds it
-- did not use refunded, to the day they were booked on (a refund never
-- reaches into the next day's count).
--
-- Safe to run more than once, and for an admission that never reached the
-- server: the refund comes out of the booking's own record, which the
-- first refund deletes, so a retry (after an answer lost to a timeout)
-- refunds nothing twice, and a booking that does not exist refunds nothing.
--
-- KEYS: 1 the caller's leases, 2 the caller's paid seconds,
--       3 the fleet's paid seconds, 4 this booking
-- ARGV: 1 booking id, 2 the day booked, 3 seconds to refund
redis.call('ZREM', KEYS[1], ARGV[1])
local booked = tonumber(redis.call('GET', KEYS[4]) or '0')
local refund = math.min(tonumber(ARGV[3]), booked)
if booked > 0 then
  redis.call('DEL', KEYS[4])
end
if refund > 0 then
  for i = 2, 3 do
    if redis.call('HGET', KEYS[i], 'day') == ARGV[2] then
      if redis.call('HINCRBY', KEYS[i], 'used', -refund) < 0 then
        redis.call('HSET', KEYS[i], 'used', 0)
      end
    end
  end
end
return 1
