-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] shared holds (sorted
-- set: owner -> expiry in ms, server clock), KEYS[4] writer marks (the
-- same); ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3] '0' to take no token.
-- A shared hold is granted while nobody holds the lock key exclusively and
-- no writer's mark is live. Each hold expires by its own score, so a
-- crashed reader stops counting after its TTL whatever the others renew;
-- the lock key is set to 'distlock:shared' with the furthest live hold's
-- expiry, so exclusive requests (and classic SET NX clients) are refused
-- exactly while some shared hold lasts.
-- Answers: the token (>= 1) when granted (1 without a token); when refused,
-- -(ms until the exclusive hold or the earliest mark ends + 3).
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= 'distlock:shared' then
  return -(redis.call('PTTL', KEYS[1]) + 3)
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
local mark = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
if mark then
  return -(tonumber(mark) - now + 3)
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local last = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]) - now
redis.call('PEXPIRE', KEYS[3], last)
redis.call('SET', KEYS[1], 'distlock:shared', 'PX', last)
if ARGV[3] == '0' then
  return 1
end
return redis.call('INCR', KEYS[2])
