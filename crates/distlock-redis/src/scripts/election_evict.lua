-- KEYS[1] leader hash; ARGV[1] the election's channel; KEYS[2] the wait
-- queue and KEYS[3] its entries' ends (see wait_queue.lua). Deletes the
-- leadership whoever holds it, as an operator would, and tells the
-- campaigners and observers (and the queue's head, if campaigners queue);
-- the fencing counter stays. Answers 1 if someone led.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], 'evicted')
  if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then
    prune(KEYS[2], KEYS[3], now_ms())
    tell(KEYS[2], ARGV[1], 0, 0)
  end
  return 1
end
return 0
