-- KEYS[1] lock key, KEYS[2] its shared holds, and for a first-come,
-- first-served lock KEYS[3] its wait queue, KEYS[4] the entries' ends and
-- KEYS[5] the queue's shared entries (see acquire.lua); ARGV[1] release
-- channel. Deletes the lock and its shared holds whoever holds them, as an
-- operator would, and tells the waiters as a release does (the queue's
-- head alone, with a queue); the fencing counter stays. Answers how many
-- of the two keys it deleted.
local deleted = redis.call('DEL', KEYS[1], KEYS[2])
if deleted > 0 then
  announce(KEYS[1], ARGV[1], KEYS[3], KEYS[4], nil, KEYS[5])
end
return deleted
