-- KEYS: leader hashes; ARGV: owner and TTL in ms for each key, in pairs.
-- Answers, per key, 1 if that owner still leads and its leadership now runs
-- for the TTL from now, else 0. An expired leadership is gone with its key
-- (the server's clock), so it is never revived.
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'owner') == ARGV[2 * i - 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    out[i] = 0
  end
end
return out
