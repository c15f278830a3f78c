-- KEYS[1] leader hash; ARGV[1] owner, ARGV[2] the election's channel;
-- with a wait queue (fifo, see wait_queue.lua) KEYS[2] the queue and
-- KEYS[3] its entries' ends.
-- Compare-and-delete, as release.lua: a leader whose lease expired finds
-- another owner here (or none) and deletes nothing. Answers 1 if the owner
-- still led until now, and only then tells the campaigners and observers
-- (with a queue, the campaigners through its head alone).
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'resigned')
  if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
    prune(KEYS[2], KEYS[3], now_ms())
    tell(KEYS[2], ARGV[2], 0, 0)
  end
  return 1
end
return 0
