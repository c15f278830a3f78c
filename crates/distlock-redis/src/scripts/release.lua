-- KEYS[1] lock key, KEYS[2] writer marks, and for a first-come,
-- first-served lock KEYS[3] its wait queue and KEYS[4] the entries' ends
-- (see acquire.lua); ARGV[1] owner, ARGV[2] release channel, ARGV[3] what
-- to remove: absent for the hold and the owner's writer mark, 'hold' the
-- hold only (Redlock rolling back a round of a wait), 'mark' the mark and
-- the queue entry only (a wait that ended or was granted).
-- Compare-and-delete: a holder whose lease expired (a GC pause, say) finds
-- another owner here and deletes nothing. The lock key never holds an
-- owner while it holds 'distlock:shared', so readers are never deleted
-- here. A removed mark is published too: the readers it held back may go.
-- What is published wakes waiters: with a live queue, 'next ' and the
-- owner at its head (that waiter alone may take the lock; waiters without
-- a queue entry, readers, wake on any message); without one, the lock key.
local function announce()
  local queue = KEYS[3]
  if queue and redis.call('EXISTS', queue) == 1 then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local ended = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 256)
    if #ended > 0 then
      redis.call('ZREM', queue, unpack(ended))
      redis.call('ZREM', KEYS[4], unpack(ended))
    end
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head then
      redis.call('PUBLISH', ARGV[2], 'next ' .. head)
      return
    end
  end
  redis.call('PUBLISH', ARGV[2], KEYS[1])
end
if ARGV[3] ~= 'mark' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  announce()
  return 1
end
if ARGV[3] ~= 'hold' then
  local unmarked = KEYS[2] and redis.call('ZREM', KEYS[2], ARGV[1]) == 1
  local left = false
  if KEYS[3] then
    left = redis.call('ZREM', KEYS[3], ARGV[1]) == 1
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  -- A waiter that leaves the queue's head of a free lock hands the turn on.
  if unmarked or (left and redis.call('EXISTS', KEYS[1]) == 0) then
    announce()
  end
end
return 0
