-- KEYS[1] lock key, KEYS[2] writer marks; ARGV[1] owner, ARGV[2] release
-- channel, ARGV[3] what to remove: absent for the hold and the
-- owner's writer mark, 'hold' the hold only (Redlock rolling back a round
-- of a wait), 'mark' the mark only (a wait that ended or was granted).
-- Compare-and-delete: a holder whose lease expired (a GC pause, say) finds
-- another owner here and deletes nothing. The lock key never holds an
-- owner while it holds 'distlock:shared', so readers are never deleted
-- here. A removed mark is published too: the readers it held back may go.
if ARGV[3] ~= 'mark' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
if ARGV[3] ~= 'hold' and KEYS[2] and redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  redis.call('PUBLISH', ARGV[2], KEYS[1])
end
return 0
