-- KEYS[1] limit; ARGV[1] new limit, ARGV[2] release channel; with a wait
-- queue (fifo) KEYS[2] permits, KEYS[3] the queue, KEYS[4] its entries'
-- ends (see wait_queue.lua).
-- Answers the old limit (nil if none was stored), or -1, changing nothing,
-- when the key holds text distlock does not write. Permits already held stay
-- held. Waiters are told either way: a higher limit may admit them, and a
-- waiter asking for the old limit should learn of the mismatch now. Queued
-- waiters hear it on their clients' own channels: those the new limit
-- brings within reach, or with a lower limit the first one, which learns
-- of the mismatch.
local old = redis.call('GET', KEYS[1])
if old and stored_count(old) < 0 then
  return -1
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'limit')
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 1 then
  local now = now_ms()
  prune(KEYS[3], KEYS[4], now)
  local free = free_permits(KEYS[2], KEYS[1], now)
  tell(KEYS[3], ARGV[2], 0, math.max(free - 1, 0))
end
return old
