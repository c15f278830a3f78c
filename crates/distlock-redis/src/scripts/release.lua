-- KEYS[1] lock key, KEYS[2] writer marks, and for a first-come,
-- first-served lock KEYS[3] its wait queue and KEYS[4] the entries' ends
-- (see acquire.lua); ARGV[1] owner, ARGV[2] release channel, ARGV[3] what
-- to remove: absent for the hold and the owner's writer mark, 'hold' the
-- hold only (Redlock rolling back a round of a wait), 'mark' the mark and
-- the queue entry ARGV[4] only (a wait that ended).
-- Compare-and-delete: a holder whose lease expired (a GC pause, say) finds
-- another owner here and deletes nothing. The lock key never holds an
-- owner while it holds 'distlock:shared', so readers are never deleted
-- here. A removed mark is announced too: the readers it held back may go.
if ARGV[3] ~= 'mark' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4])
  return 1
end
if ARGV[3] ~= 'hold' then
  local unmarked = KEYS[2] and redis.call('ZREM', KEYS[2], ARGV[1]) == 1
  local left = false
  if KEYS[3] and ARGV[4] then
    left = redis.call('ZREM', KEYS[3], ARGV[4]) == 1
    redis.call('ZREM', KEYS[4], ARGV[4])
  end
  -- A waiter that leaves the queue of a free lock may have been its head:
  -- the turn passes on.
  if unmarked or (left and redis.call('EXISTS', KEYS[1]) == 0) then
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4])
  end
end
return 0
