-- KEYS[1] leader hash. Reads only. Answers { PTTL, value, token, owner,
-- settled } of the live leadership (the key lives exactly as long as it
-- does, by this server's clock), or { -2 } when nobody leads. `settled` is
-- set by election_settle.lua (Redlock's fencing write-back) and nil
-- otherwise.
local pttl = redis.call('PTTL', KEYS[1])
if pttl == -2 then
  return { -2 }
end
local fields = redis.call('HMGET', KEYS[1], 'value', 'token', 'owner', 'settled')
return { pttl, fields[1], fields[2], fields[3], fields[4] }
