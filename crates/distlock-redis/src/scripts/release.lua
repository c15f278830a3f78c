-- KEYS[1] lock key; ARGV[1] owner, ARGV[2] release channel.
-- Compare-and-delete: a holder whose lease expired (a GC pause, say) finds
-- another owner here and deletes nothing.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
