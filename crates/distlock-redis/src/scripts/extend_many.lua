-- KEYS: lock keys; ARGV: owner and TTL in ms for each key, in pairs.
-- Answers, per key, 1 if it was extended and 0 if that owner no longer
-- holds it. One round trip renews a whole batch of one client's locks.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
