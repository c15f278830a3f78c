-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] shared holds (sorted
-- set: owner -> expiry in ms, server clock), KEYS[4] writer marks (the
-- same); ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3] '0' to take no token.
-- A shared hold is granted while nobody holds the lock key exclusively and
-- no writer's mark is live. Each hold expires by its own score, so a
-- crashed reader stops counting after its TTL whatever the others renew;
-- the lock key is set to 'distlock:shared' with the furthest live hold's
-- expiry, so exclusive requests (and classic SET NX clients) are refused
-- exactly while some shared hold lasts.
-- With a wait queue (fifo, shared with the lock's exclusive waiters, see
-- acquire.lua): KEYS[5] the queue, KEYS[6] its entries' ends, KEYS[7] the
-- queue's shared entries (the same scores); ARGV[4] '1' for an attempt of
-- a wait (refused, it joins the queue or renews its entry) and '0' for a
-- try, ARGV[5] how long the entry lasts (ms) unless renewed, ARGV[6] the
-- caller's entry, ARGV[7], if given, the entry's place in the queue
-- (Redlock: the same number on every node), else the server's time of its
-- first refusal. A shared request is then refused while an exclusive
-- waiter's entry is ahead of it (any such entry, for a caller not queued)
-- instead of while a writer's mark lasts: readers never pass a writer
-- that came first, never wait for one that came after them (whose mark
-- would otherwise hold back the queue's head), and the readers queued
-- together at the head are granted together.
-- Answers: the token (>= 1) when granted (1 without a token); when refused,
-- -(ms until the exclusive hold or the earliest mark ends + 3), or for a
-- queued caller behind a writer, -(a third of its entry's life + 3).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local queue = KEYS[5]
local queued, behind = false, false
if queue and redis.call('EXISTS', queue) == 1 then
  local ended = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', now, 'LIMIT', 0, 256)
  if #ended > 0 then
    redis.call('ZREM', queue, unpack(ended))
    redis.call('ZREM', KEYS[6], unpack(ended))
    redis.call('ZREM', KEYS[7], unpack(ended))
  end
  local arrival = redis.call('ZSCORE', queue, ARGV[6])
  queued = arrival ~= false
  local upto = arrival and ('(' .. arrival) or '+inf'
  -- An exclusive entry ahead: more entries ahead than shared ones (each
  -- shared entry is in both sets, at the same place), however many
  -- readers wait ahead of it. Every script that adds a shared entry adds
  -- it to both, and every one that removes it removes it from both: one
  -- left in the shared entries alone would hide a writer.
  behind = redis.call('ZCOUNT', queue, '-inf', upto) > redis.call('ZCOUNT', KEYS[7], '-inf', upto)
end
local refused = nil
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= 'distlock:shared' then
  local pttl = redis.call('PTTL', KEYS[1])
  -- A holder that is not distlock's (see acquire.lua) announces no release:
  -- look again within 100 ms, not at its expiry.
  if pttl > 100
      and not (string.find(holder, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x')
        and (#holder == 36 or string.sub(holder, 37, 37) == ' ')) then
    pttl = 100
  end
  refused = -(pttl + 3)
elseif behind then
  refused = -3
elseif not queue then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local mark = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')[2]
  if mark then
    refused = -(tonumber(mark) - now + 3)
  end
end
if refused and holder == 'distlock:shared' then
  -- The caller's own live hold: this same request sent again after its
  -- answer was lost (a reconnect re-sends it). Granted again, not refused
  -- while its hold keeps writers out.
  local mine = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if mine and tonumber(mine) > now then
    refused = nil
  end
end
if refused then
  if queue and ARGV[4] == '1' then
    local life = tonumber(ARGV[5])
    local place = ARGV[7] or string.format('%.0f', tonumber(time[1]) * 1000000 + tonumber(time[2]))
    redis.call('ZADD', queue, 'NX', place, ARGV[6])
    redis.call('ZADD', KEYS[6], now + life, ARGV[6])
    redis.call('ZADD', KEYS[7], 'NX', place, ARGV[6])
    if redis.call('PTTL', queue) < life then
      redis.call('PEXPIRE', queue, life)
      redis.call('PEXPIRE', KEYS[6], life)
    end
    if redis.call('PTTL', KEYS[7]) < life then
      redis.call('PEXPIRE', KEYS[7], life)
    end
    if behind then
      return -(math.floor(life / 3) + 3)
    end
  end
  return refused
end
if queued then
  redis.call('ZREM', queue, ARGV[6])
  redis.call('ZREM', KEYS[6], ARGV[6])
  redis.call('ZREM', KEYS[7], ARGV[6])
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
local last = tonumber(redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]) - now
redis.call('PEXPIRE', KEYS[3], last)
redis.call('SET', KEYS[1], 'distlock:shared', 'PX', last)
if ARGV[3] == '0' then
  return 1
end
local token = redis.call('INCR', KEYS[2])
if token < 1 then
  -- A counter distlock did not write (a negative number): the hold is
  -- undone and 0 answered, which the caller reports.
  redis.call('DECR', KEYS[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  local furthest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
  if furthest then
    redis.call('PEXPIRE', KEYS[3], tonumber(furthest) - now)
    redis.call('PEXPIRE', KEYS[1], tonumber(furthest) - now)
  else
    redis.call('DEL', KEYS[1], KEYS[3])
  end
  return 0
end
return token
