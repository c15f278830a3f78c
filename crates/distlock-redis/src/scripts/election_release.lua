-- KEYS[1] leader hash; ARGV[1] owner, ARGV[2] the election's channel;
-- with a wait queue (fifo, see wait_queue.lua) KEYS[2] the queue and
-- KEYS[3] its entries' ends, and ARGV[3] what else (Redlock): 'entry'
-- removes the campaign's queue entry ARGV[4] too (it stays on a node that
-- refused the campaign's last round), 'requeue' puts the entry ARGV[4]
-- back at its place ARGV[5] for ARGV[6] ms (rolling back a round of a
-- queued campaign: it keeps its turn, and is not told of the resignation
-- it makes itself).
-- Compare-and-delete, as release.lua: a leader whose lease expired finds
-- another owner here (or none) and deletes nothing. Answers 1 if the owner
-- still led until now, and only then tells the campaigners and observers
-- (with a queue, the campaigners through its head alone).
local queued = KEYS[2] ~= nil
local what = ARGV[3]
if queued and what == 'entry' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  redis.call('ZREM', KEYS[3], ARGV[4])
elseif queued and what == 'requeue' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  join(KEYS[2], KEYS[3], ARGV[4], tonumber(ARGV[6]), time, now, ARGV[5])
end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'resigned')
  if queued and redis.call('EXISTS', KEYS[2]) == 1 then
    prune(KEYS[2], KEYS[3], now_ms())
    if what ~= 'requeue' or redis.call('ZRANGE', KEYS[2], 0, 0)[1] ~= ARGV[4] then
      tell(KEYS[2], ARGV[2], 0, 0)
    end
  end
  return 1
end
return 0
