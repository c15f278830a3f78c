-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] writer marks (sorted
-- set: owner -> expiry in ms, server clock); ARGV[1] owner, ARGV[2] TTL in
-- ms, ARGV[3] how the caller asks: '0' (or absent) once, '1' the first
-- attempt of a wait, '2' a later attempt of a wait; ARGV[4] '0' to take no
-- token (Redlock without fencing).
-- SET NX PX is one command, so a crash can never leave a lock without expiry,
-- and the token is taken in the same script, so every grant has one.
-- Shared holds keep the lock key set to 'distlock:shared' (see
-- shared_acquire.lua), so the same SET NX refuses an exclusive request
-- while readers hold the name: the uncontended path is SET and INCR only.
-- One integer answers (cheaper for the server than a table): the token
-- (>= 1) when granted; when held, -(PTTL + 3), so -1 and -2 stand for PTTL
-- -2 (the key just vanished) and -1 (a key without expiry). A waiting
-- caller refused because of shared holds marks the name as awaited by a
-- writer (no new shared hold is granted while the mark lasts) and gets
-- { -(PTTL + 3) }, a table, so that it knows it left a mark.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '2' then
    -- A mark an earlier attempt of this wait left.
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  if ARGV[4] == '0' then
    return 1
  end
  return redis.call('INCR', KEYS[2])
end
local held = -(redis.call('PTTL', KEYS[1]) + 3)
if (ARGV[3] == '1' or ARGV[3] == '2') and redis.call('GET', KEYS[1]) == 'distlock:shared' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
  -- The set lives as long as its longest mark; each mark's own end is its
  -- score, pruned by shared_acquire.lua.
  local furthest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIRE', KEYS[3], tonumber(furthest) - now)
  return { held }
end
return held
