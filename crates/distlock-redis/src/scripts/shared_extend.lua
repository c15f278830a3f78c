-- KEYS: lock key and shared holds, in pairs, per hold; ARGV: owner and TTL
-- in ms, in pairs, per hold. Answers, per hold, 1 if that owner's shared
-- hold was live and now runs for the TTL from now, else 0: an expired hold
-- may already count as gone to a writer, so it is never revived, and a
-- hold whose lock key no longer says 'distlock:shared' (an operator
-- deleted it) is dropped. The lock key's expiry follows the furthest live
-- hold, never further: a crashed reader's score is left as it was.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {}
for i = 1, #KEYS, 2 do
  local lock, readers = KEYS[i], KEYS[i + 1]
  local owner = ARGV[i]
  local score = redis.call('ZSCORE', readers, owner)
  if score and tonumber(score) > now and redis.call('GET', lock) == 'distlock:shared' then
    redis.call('ZADD', readers, now + tonumber(ARGV[i + 1]), owner)
    local last = tonumber(redis.call('ZRANGE', readers, -1, -1, 'WITHSCORES')[2]) - now
    redis.call('PEXPIRE', readers, last)
    redis.call('PEXPIRE', lock, last)
    out[#out + 1] = 1
  else
    if score then
      redis.call('ZREM', readers, owner)
    end
    out[#out + 1] = 0
  end
end
return out
