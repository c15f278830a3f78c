-- KEYS[1] permits (sorted set: owner -> expiry in ms), KEYS[2] limit,
-- KEYS[3] fencing counter; ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3] limit,
-- ARGV[4] '1' to take a fencing token, '0' for none (Redlock without
-- fencing, where tokens are declared meaningless: no counter is kept);
-- with a wait queue (fifo, see wait_queue.lua) KEYS[4] the queue and
-- KEYS[5] its entries' ends, ARGV[5] '1' for an attempt of a wait (refused,
-- it joins the queue or renews its entry) and '0' for a try, ARGV[6] how
-- long the entry lasts (ms) unless the waiter's next attempt renews it,
-- ARGV[7] the caller's entry, ARGV[8], if given, the entry's place
-- (Redlock: the same on every node).
-- With a queue, first come, first served: a caller may take a permit only
-- if the live permits and the live entries ahead of it (all of them, for a
-- caller not queued) leave one free.
-- Expiry is judged by this server's clock (TIME), never the client's, so a
-- client with a fast or slow clock cannot shorten or stretch a permit.
-- Answers: the token (>= 1; 0 without fencing) when granted; when all
-- permits are held, -(ms until the earliest permit expires), always <= -1;
-- when queued waiters ahead alone refused it, -(a third of ARGV[6] + 3);
-- when the stored limit differs from ARGV[3], a table holding the stored
-- limit, or { -1 } when the limit key holds something other than a count
-- distlock writes (a whole number from 1 to 4294967295).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local limit = tonumber(ARGV[3])
local stored = redis.call('GET', KEYS[2])
if not stored then
  -- The first acquire stores the limit; only set_limit changes it after.
  redis.call('SET', KEYS[2], ARGV[3])
else
  local n = stored_count(stored)
  if n < 0 then
    return { -1 }
  elseif n ~= limit then
    return { n }
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local live = redis.call('ZCARD', KEYS[1])
local queue = KEYS[4]
local ahead = 0
local queued = false
if queue and redis.call('EXISTS', queue) == 1 then
  prune(queue, KEYS[5], now)
  local arrival = redis.call('ZSCORE', queue, ARGV[7])
  queued = arrival ~= false
  ahead = ahead_of(queue, arrival or nil, limit - live)
end
-- The same owner asking again (a retry after a lost reply) renews its own
-- permit instead of taking a second one; ZADD of an existing member only
-- moves its score.
if live + ahead < limit or redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  if queued then
    redis.call('ZREM', queue, ARGV[7])
    redis.call('ZREM', KEYS[5], ARGV[7])
  end
  local token = 0
  if ARGV[4] == '1' then
    token = redis.call('INCR', KEYS[3])
    if token < 1 then
      -- A counter distlock did not write (a negative number): nothing is
      -- granted, and 0 answered, which the caller reports.
      redis.call('DECR', KEYS[3])
      return 0
    end
  end
  local ttl = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  -- The set lives as long as its longest permit, so a semaphore whose
  -- holders all vanished leaves no permits behind. Its expiry only moves
  -- later: a set that was empty is new (ZREMRANGEBYSCORE deleted it or it
  -- never existed), else it already lives as long as its other permits.
  if live == 0 or redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
  return token
end
if queue and ARGV[5] == '1' then
  join(queue, KEYS[5], ARGV[7], tonumber(ARGV[6]), time, now, ARGV[8])
end
if queue and live < limit then
  -- Refused by the waiters ahead alone: nothing to try at a permit's end;
  -- back to renew the entry (the release that reaches it tells it).
  return -(math.floor(tonumber(ARGV[6]) / 3) + 3)
end
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
if not earliest then
  -- A limit of 0 stored by a foreign client: nothing will ever expire.
  return -100
end
return -(tonumber(earliest) - now)
