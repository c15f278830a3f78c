-- KEYS[1] lock key, KEYS[2] fencing counter; ARGV[1] owner, ARGV[2] TTL in ms.
-- SET NX PX is one command, so a crash can never leave a lock without expiry,
-- and the token is taken in the same script, so every grant has one.
-- One integer answers (cheaper for the server than a table): the token
-- (>= 1) when granted; when held, -(PTTL + 3), so -1 and -2 stand for PTTL
-- -2 (the key just vanished) and -1 (a key without expiry).
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return -(redis.call('PTTL', KEYS[1]) + 3)
