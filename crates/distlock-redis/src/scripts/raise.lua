-- KEYS[1] fencing counter; ARGV[1] token. Raise the counter to the token,
-- never lower it (Redlock writes a quorum's token back to its majority).
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
end
return 1
