-- A record a replica wrote (a session's holder), deleted or given a shorter
-- life, and only while it still holds exactly what that replica wrote: a
-- replica never removes, or cuts short, a record another replica (or anyone
-- else) has put under the key since.
--
-- KEYS: 1 the record
-- ARGV: 1 the value this replica wrote, 2 milliseconds it may live from now
--       at most (0: delete it now)
-- Returns 1 when the record was this replica's, 0 otherwise (gone, or
-- holding something else).
-- TYPE first: GET on a key of another type is an error, which would only
-- be retried for nothing.
if redis.call('TYPE', KEYS[1]).ok ~= 'string' or redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local keep = tonumber(ARGV[2])
if keep <= 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
-- Never lengthened: a record keeps the expiry it was written with if that
-- comes sooner.
local left = redis.call('PTTL', KEYS[1])
if left < 0 or left > keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return 1
