-- KEYS[1] permits; ARGV[1] owner, ARGV[2] release channel; with a wait
-- queue (fifo) KEYS[2] the queue, KEYS[3] its entries' ends, KEYS[4] the
-- limit (see wait_queue.lua), and ARGV[3] what else (Redlock): 'entry'
-- removes the waiter's queue entry ARGV[4] too (it stays on a node that
-- refused the waiter's last round), 'requeue' puts the entry ARGV[4] back
-- at its place ARGV[5] for ARGV[6] ms (rolling back a round of a queued
-- wait: it keeps its turn, and is not told of the permit it frees itself).
-- Removes only this owner's entry, so a holder whose permit expired (a GC
-- pause) frees nobody else's. Answers 1 only if the permit was still live;
-- only then is a permit freed, and only then are waiters told: without a
-- queue, on the semaphore's channel; with one, also the one queued waiter
-- the freed permit is for (the last place the free permits reach: the
-- places before it were told by the releases that freed theirs).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local what = ARGV[3]
if KEYS[2] and what == 'entry' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('ZREM', KEYS[3], ARGV[4])
elseif KEYS[2] and what == 'requeue' then
  join(KEYS[2], KEYS[3], ARGV[4], tonumber(ARGV[6]), time, now, ARGV[5])
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(score) > now then
  redis.call('PUBLISH', ARGV[2], 'permit')
  if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
    prune(KEYS[2], KEYS[3], now)
    local free = free_permits(KEYS[1], KEYS[4], now)
    if free > 0 and (what ~= 'requeue'
        or redis.call('ZRANGE', KEYS[2], free - 1, free - 1)[1] ~= ARGV[4]) then
      tell(KEYS[2], ARGV[2], free - 1, free - 1)
    end
  end
  return 1
end
return 0
