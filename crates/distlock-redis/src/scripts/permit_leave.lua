-- KEYS[1] permits, KEYS[2] the wait queue, KEYS[3] its entries' ends,
-- KEYS[4] the limit (see wait_queue.lua); ARGV[1] the entry of a wait
-- that ended without a permit, ARGV[2] release channel.
-- Removes the entry. If its place was within the free permits' reach (it
-- may have been told its turn), the entry that moves up into reach is
-- told instead. Answers 1 if the entry was there.
local arrival = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not arrival then
  return 0
end
local now = now_ms()
prune(KEYS[2], KEYS[3], now)
local free = free_permits(KEYS[1], KEYS[4], now)
local within = ahead_of(KEYS[2], arrival, free) < free
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if within then
  tell(KEYS[2], ARGV[2], free - 1, free - 1)
end
return 1
