-- KEYS[1] lock key, KEYS[2] shared holds, for a first-come, first-served
-- lock KEYS[3] its wait queue and KEYS[4] the entries' ends, and KEYS[5],
-- if given, the queue's shared entries; ARGV[1] owner, ARGV[2] release
-- channel; with a queue, ARGV[3] what else (Redlock): 'entry' removes the
-- owner's queue entry ARGV[4] too (it stays on a node that refused the
-- reader's last round), 'requeue' puts the entry ARGV[4] back at its place
-- ARGV[5] for ARGV[6] ms (rolling back a round of a queued wait: the
-- reader keeps its turn, and is not told of the release it makes itself).
-- Removes only this owner's hold; the lock key then expires with
-- the furthest remaining live hold, or goes with the last one, which is
-- announced (a waiting writer may go: see announce.lua); a release that
-- brings the key's end forward publishes it too (a waiting writer looks
-- again, and sleeps until the new end). Answers 1 only if the hold was
-- still live.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local what = ARGV[3]
local skip = nil
if what == 'entry' then
  redis.call('ZREM', KEYS[3], ARGV[4])
  redis.call('ZREM', KEYS[4], ARGV[4])
  redis.call('ZREM', KEYS[5], ARGV[4])
elseif what == 'requeue' then
  local life = tonumber(ARGV[6])
  redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4])
  redis.call('ZADD', KEYS[4], now + life, ARGV[4])
  redis.call('ZADD', KEYS[5], 'NX', ARGV[5], ARGV[4])
  for _, key in ipairs({ KEYS[3], KEYS[4], KEYS[5] }) do
    if redis.call('PTTL', key) < life then
      redis.call('PEXPIRE', key, life)
    end
  end
  skip = ARGV[4]
end
local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('GET', KEYS[1]) == 'distlock:shared' then
  local furthest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')[2]
  if furthest then
    redis.call('PEXPIRE', KEYS[1], tonumber(furthest) - now)
    redis.call('PEXPIRE', KEYS[2], tonumber(furthest) - now)
    -- The lock key now ends sooner: a writer that waits for its end (its
    -- last attempt read the later one) is told to look again.
    if tonumber(score) > tonumber(furthest) then
      redis.call('PUBLISH', ARGV[2], KEYS[1])
    end
  else
    redis.call('DEL', KEYS[1])
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4], skip, KEYS[5])
  end
end
if tonumber(score) > now then
  return 1
end
return 0
