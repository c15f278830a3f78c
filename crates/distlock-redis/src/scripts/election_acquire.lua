-- KEYS[1] leader (hash: owner, value, token; expiring as a whole with the
-- leadership's lease, by this server's clock), KEYS[2] fencing counter;
-- ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3] the campaign's value,
-- ARGV[4] the election's channel.
-- One script, one round trip: the value is stored by the request that
-- grants, so nobody ever reads a leader without its value, and the grant
-- is published ('granted') by the same call, so an observer that read
-- nobody leading learns of the new leader at once (campaigners ignore it).
-- Answers: the token (>= 1) when granted; when someone else leads,
-- -(PTTL + 3), so -1 and -2 stand for PTTL -2 (the key just vanished) and
-- -1 (a key without expiry), as acquire.lua does. The same owner asking
-- again (a retry after a lost reply) renews its leadership and gets its
-- token again, with the value it leads with now.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token')) or 0
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return -(redis.call('PTTL', KEYS[1]) + 3)
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'value', ARGV[3], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], 'granted')
return token
