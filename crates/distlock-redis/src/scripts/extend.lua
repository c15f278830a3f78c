-- KEYS[1] lock key; ARGV[1] owner, ARGV[2] TTL in ms.
-- Only the owner of this very acquisition may extend.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
