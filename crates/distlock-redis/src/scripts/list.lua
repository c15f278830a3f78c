-- KEYS[1] lock key, KEYS[2] its fencing counter, KEYS[3] shared holds,
-- KEYS[4] permits, KEYS[5] the semaphore's limit, KEYS[6] leader hash: every
-- object of one name, all in one Cluster slot. Reads only. Answers
-- { lock key's value, its PTTL, the fencing counter or 0,
--   { { owner, ms left } of each live shared hold },
--   the stored limit or 0, { { owner, ms left } of each live permit },
--   leader hash's PTTL (-2: nobody leads), { owner, value, token, settled } },
-- live by this server's clock. A key of an unexpected type (a foreign key
-- under a lock name) reads as absent instead of failing the listing.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function read(...)
  local answer = redis.pcall(...)
  if type(answer) == 'table' and answer.err then
    return false
  end
  return answer
end
local function live(key)
  local out = {}
  local members = read('ZRANGEBYSCORE', key, '(' .. now, '+inf', 'WITHSCORES') or {}
  for i = 1, #members, 2 do
    out[#out + 1] = { members[i], tonumber(members[i + 1]) - now }
  end
  return out
end
local value = read('GET', KEYS[1])
if type(value) ~= 'string' then
  value = false
end
local leader = {}
local leader_pttl = redis.call('PTTL', KEYS[6])
if leader_pttl ~= -2 then
  leader = read('HMGET', KEYS[6], 'owner', 'value', 'token', 'settled') or {}
end
return {
  value,
  redis.call('PTTL', KEYS[1]),
  tonumber(read('GET', KEYS[2]) or '0') or 0,
  live(KEYS[3]),
  tonumber(read('GET', KEYS[5]) or '0') or 0,
  live(KEYS[4]),
  leader_pttl,
  leader,
}
