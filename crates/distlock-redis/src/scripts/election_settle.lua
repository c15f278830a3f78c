-- KEYS[1] leader hash, KEYS[2] fencing counter; ARGV[1] owner, ARGV[2]
-- token. Redlock's fencing write-back for an election: raises the counter
-- to the token (never lowers it), as raise.lua does, and, while the owner
-- leads here, stores the token in the leader hash and marks it settled, so
-- every node of the granting quorum reports the token of the grant.
-- Answers 1 if the owner leads here and the token is stored, else 0.
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
if current < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('HSET', KEYS[1], 'token', ARGV[2], 'settled', '1')
  return 1
end
return 0
