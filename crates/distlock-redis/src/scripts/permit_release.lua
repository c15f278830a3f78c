-- KEYS[1] permits; ARGV[1] owner, ARGV[2] release channel.
-- Removes only this owner's entry, so a holder whose permit expired (a GC
-- pause) frees nobody else's. Answers 1 only if the permit was still live;
-- only then is a permit freed, and only then are waiters told.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(score) > now then
  redis.call('PUBLISH', ARGV[2], 'permit')
  return 1
end
return 0
