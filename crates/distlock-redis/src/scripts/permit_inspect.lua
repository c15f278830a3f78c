-- KEYS[1] permits, KEYS[2] limit. Answers { stored limit or 0, { owners
-- of live permits } }, live by this server's clock. Reads only.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local limit = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
return { limit, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf') }
