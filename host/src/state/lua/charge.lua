-- One run charged to a caller's rate bucket and nothing else (a session
-- call: the session already holds the caller's place and paid seconds).
-- (bucket.lua comes first: server_time, take_token.)
--
-- KEYS: 1 the caller's rate bucket (hash: tokens, at)
-- ARGV: 1 runs per minute, 2 burst
-- Returns 'ok' or 'rate'.
local now = server_time()
if take_token(KEYS[1], now, tonumber(ARGV[1]), tonumber(ARGV[2])) then
  return 'ok'
end
return 'rate'
