-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] shared holds, KEYS[4]
-- writer marks. Reads only. Answers { PTTL of the lock key, the fencing
-- counter or 0, { owners of live shared holds }, { owners of live writer
-- marks }, the lock key's value }, live by this server's clock. The value
-- is the exclusive holder's stored owner ('distlock:shared' while shared
-- holds last), or nil when the key is missing or not a string (a foreign
-- key of another type under a lock name).
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local value = redis.pcall('GET', KEYS[1])
if type(value) ~= 'string' then
  value = false
end
return {
  redis.call('PTTL', KEYS[1]),
  tonumber(redis.call('GET', KEYS[2]) or '0') or 0,
  redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf'),
  redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. now, '+inf'),
  value,
}
