-- KEYS[1] limit; ARGV[1] new limit, ARGV[2] release channel.
-- Answers the old limit (nil if none was stored). Permits already held stay
-- held. Waiters are told either way: a higher limit may admit them, and a
-- waiter asking for the old limit should learn of the mismatch now.
local old = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PUBLISH', ARGV[2], 'limit')
return old
