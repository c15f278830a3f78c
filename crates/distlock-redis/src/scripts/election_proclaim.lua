-- KEYS[1] leader hash; ARGV[1] owner, ARGV[2] new value, ARGV[3] the
-- election's channel. Replaces the value only while the owner still leads
-- (the key lives exactly as long as the leadership), keeping its token and
-- expiry. Answers 1 if it did, else 0.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'value', ARGV[2])
  redis.call('PUBLISH', ARGV[3], 'proclaimed')
  return 1
end
return 0
