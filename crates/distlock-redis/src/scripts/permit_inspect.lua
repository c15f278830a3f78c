-- KEYS[1] permits, KEYS[2] limit. Answers { stored limit, 0 if none is
-- stored or -1 if the key holds something other than a count distlock
-- writes, { owners of live permits } }, live by this server's clock. Reads
-- only.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local stored = redis.call('GET', KEYS[2])
local limit = 0
if stored then
  limit = stored_count(stored)
end
return { limit, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf') }
