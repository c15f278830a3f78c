-- KEYS: a lock key and its fencing counter for each lock, in pairs; ARGV:
-- each lock's owner and TTL in ms, in pairs. All or nothing: if any lock
-- is held, nothing is written and the answer is 0; otherwise every lock is
-- set (with its expiry, as acquire.lua does) and the answer is the tokens,
-- in order. One round trip for the whole set, on one server. A lock that
-- holds its own owner already is this same request sent again after its
-- answer was lost (a reconnect re-sends it): taken again, not refused.
for i = 1, #KEYS, 2 do
  local holder = redis.call('GET', KEYS[i])
  if holder and holder ~= ARGV[i] then
    return 0
  end
end
local tokens = {}
for i = 1, #KEYS, 2 do
  local token = redis.call('INCR', KEYS[i + 1])
  tokens[#tokens + 1] = token
  if token < 1 then
    -- A counter distlock did not write (a negative number): the counters
    -- raised are lowered again, nothing is set, and -1 answered, which
    -- the caller reports.
    for j = 1, i, 2 do
      redis.call('DECR', KEYS[j + 1])
    end
    return -1
  end
end
for i = 1, #KEYS, 2 do
  redis.call('SET', KEYS[i], ARGV[i], 'PX', ARGV[i + 1])
end
return tokens
