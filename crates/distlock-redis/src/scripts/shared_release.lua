-- KEYS[1] lock key, KEYS[2] shared holds, for a first-come, first-served
-- lock KEYS[3] its wait queue and KEYS[4] the entries' ends, and KEYS[5],
-- if given, the queue's shared entries; ARGV[1]
-- owner, ARGV[2] release channel. Removes only this owner's hold; the lock key then expires with
-- the furthest remaining live hold, or goes with the last one, which is
-- announced (a waiting writer may go: see announce.lua). Answers 1 only if the hold was
-- still live.
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then
  return 0
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('GET', KEYS[1]) == 'distlock:shared' then
  local furthest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
  if furthest then
    redis.call('PEXPIRE', KEYS[1], tonumber(furthest) - now)
    redis.call('PEXPIRE', KEYS[2], tonumber(furthest) - now)
  else
    redis.call('DEL', KEYS[1])
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4], nil, KEYS[5])
  end
end
if tonumber(score) > now then
  return 1
end
return 0
