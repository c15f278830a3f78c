-- KEYS: permit sets; ARGV: owner and TTL in ms for each key, in pairs.
-- Answers, per key, 1 if that owner's permit was live and now runs for the
-- TTL from now, else 0: an expired permit may already count as free to
-- others, so it is never revived.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local owner = ARGV[2 * i - 1]
  local score = redis.call('ZSCORE', key, owner)
  if score and tonumber(score) > now then
    redis.call('ZADD', key, now + tonumber(ARGV[2 * i]), owner)
    local furthest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
    redis.call('PEXPIRE', key, tonumber(furthest) - now)
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
