-- KEYS[1] lock key, KEYS[2] fencing counter; ARGV[1] owner, ARGV[2] TTL in ms.
-- SET NX PX is one command, so a crash can never leave a lock without expiry,
-- and the token is taken in the same script, so every grant has one.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
-- Held: tell the waiter how long the holder's lease still runs.
return {0, redis.call('PTTL', KEYS[1])}
