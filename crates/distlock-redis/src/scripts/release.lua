-- KEYS[1] lock key, KEYS[2] writer marks, and for a first-come,
-- first-served lock KEYS[3] its wait queue and KEYS[4] the entries' ends
-- (see acquire.lua), and KEYS[5], if given, the queue's shared entries
-- (see shared_acquire.lua); ARGV[1] owner, ARGV[2] release channel, ARGV[3] what
-- to remove: absent for the hold and the owner's writer mark, 'hold' the
-- hold only (Redlock rolling back a round of a wait), 'mark' the mark and
-- the queue entry ARGV[4] only (a wait that ended), 'entry' as when absent
-- and the entry ARGV[4] too (Redlock's release: the entry may stay on a
-- node that refused the waiter's last round), 'requeue' the hold only,
-- the entry ARGV[4] put back in its place ARGV[5] for ARGV[6] ms (Redlock
-- rolling back a queued waiter's round: it keeps its turn).
-- Compare-and-delete: a holder whose lease expired (a GC pause, say) finds
-- another owner here and deletes nothing. The lock key never holds an
-- owner while it holds 'distlock:shared', so readers are never deleted
-- here. A removed mark is announced too: the readers it held back may go.
local what = ARGV[3]
if what ~= 'mark' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local skip = nil
  if what == 'requeue' then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local life = tonumber(ARGV[6])
    redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4])
    redis.call('ZADD', KEYS[4], now + life, ARGV[4])
    if redis.call('PTTL', KEYS[3]) < life then
      redis.call('PEXPIRE', KEYS[3], life)
      redis.call('PEXPIRE', KEYS[4], life)
    end
    -- Its own turn again: nobody else is told the lock is free here.
    skip = ARGV[4]
  elseif what == 'entry' then
    -- An exclusive holder's entry: never among the shared entries.
    redis.call('ZREM', KEYS[3], ARGV[4])
    redis.call('ZREM', KEYS[4], ARGV[4])
  end
  -- A rolled-back round announces nothing: the roller, listening on the
  -- channel too, would wake itself at once; a waiter this node refused
  -- meanwhile (Redlock) looks again within a few retry delays.
  if what ~= 'hold' then
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4], skip, KEYS[5])
  end
  return 1
end
if what ~= 'hold' and what ~= 'requeue' then
  local unmarked = KEYS[2] and redis.call('ZREM', KEYS[2], ARGV[1]) == 1
  local left = false
  if KEYS[3] and ARGV[4] then
    left = redis.call('ZREM', KEYS[3], ARGV[4]) == 1
    redis.call('ZREM', KEYS[4], ARGV[4])
    if KEYS[5] then
      redis.call('ZREM', KEYS[5], ARGV[4])
    end
  end
  -- A waiter that leaves the queue of a lock not held exclusively may have
  -- been its head: the turn passes on.
  if unmarked or (left and redis.call('GET', KEYS[1]) == false) then
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4], nil, KEYS[5])
  elseif left and KEYS[5] and redis.call('EXISTS', KEYS[5]) == 1
      and redis.call('GET', KEYS[1]) == 'distlock:shared' then
    -- Readers hold: a reader queued behind the one that left may join them.
    announce(KEYS[1], ARGV[2], KEYS[3], KEYS[4], nil, KEYS[5])
  end
end
return 0
