-- KEYS[1] leader hash, KEYS[2] the wait queue, KEYS[3] its entries' ends
-- (see wait_queue.lua); ARGV[1] the entry of a campaign that ended without
-- leading, ARGV[2] the election's channel.
-- Removes the entry. If it headed the queue while nobody leads (it may
-- have been told its turn), the new head is told instead. Answers 1 if the
-- entry was there.
local arrival = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not arrival then
  return 0
end
prune(KEYS[2], KEYS[3], now_ms())
local headed = ahead_of(KEYS[2], arrival, 1) == 0
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if headed and redis.call('EXISTS', KEYS[1]) == 0 then
  tell(KEYS[2], ARGV[2], 0, 0)
end
return 1
