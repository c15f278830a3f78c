-- KEYS[1] lock key, KEYS[2] fencing counter, KEYS[3] writer marks (sorted
-- set: owner -> expiry in ms, server clock), and for a first-come,
-- first-served lock KEYS[4] its wait queue (sorted set: owner -> arrival,
-- microseconds of server time), KEYS[5] the queue entries' ends
-- (owner -> ms, server clock) and KEYS[6] the queue's shared entries (see
-- shared_acquire.lua), pruned with the queue; ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3]
-- how the caller asks: '0' (or absent) once, '1' the first attempt of a
-- wait, '2' a later attempt of a wait; ARGV[4] '0' to take no token
-- (Redlock without fencing); with a queue, ARGV[5] how long a waiter's
-- entry lasts (ms) unless its next attempt renews it, and ARGV[6] the
-- caller's entry: its client's id, a space, and the owner (announce.lua
-- wakes the head through its client's channel); ARGV[7], if given, the
-- entry's place in the queue (Redlock: the same number on every node, so
-- that the nodes order their waiters alike), else the server's time of
-- its first refusal.
-- SET NX PX is one command, so a crash can never leave a lock without expiry,
-- and the token is taken in the same script, so every grant has one.
-- Shared holds keep the lock key set to 'distlock:shared' (see
-- shared_acquire.lua), so the same SET NX refuses an exclusive request
-- while readers hold the name: the uncontended path is EXISTS (of the
-- queue, and for a wait's first attempt of the writer marks), SET and
-- INCR only.
-- With a queue, the lock goes to the waiter at the queue's head: any other
-- caller is refused while a live entry is ahead of it, even if the lock is
-- free, and a waiting caller refused joins the queue (or renews its entry).
-- An entry whose waiter stopped renewing it (killed, cut off) ends by the
-- server's clock and is dropped by the next attempt that looks.
-- One integer answers (cheaper for the server than a table): the token
-- (>= 1) when granted; when held, -(PTTL + 3) (the PTTL at most 100 for a
-- holder that is not distlock's), so -1 and -2 stand for PTTL
-- -2 (the key just vanished) and -1 (a key without expiry). A waiting
-- caller that left a writer's mark or waits behind another queued waiter
-- gets { -(PTTL + 3), flags } instead: flags 1 marked, 2 behind, 3 both.
-- 0 answers a fencing counter that holds a negative number (not
-- distlock's): nothing is granted.
local queue = KEYS[4]
local queued = queue and redis.call('EXISTS', queue) == 1
local function granted()
  if ARGV[3] == '2' or (ARGV[3] == '1' and redis.call('EXISTS', KEYS[3]) == 1) then
    -- A mark an earlier attempt of this wait left, or that this same first
    -- attempt left when it was refused and is now sent again after its
    -- answer was lost (a reconnect re-sends it).
    redis.call('ZREM', KEYS[3], ARGV[1])
  end
  if ARGV[4] == '0' then
    return 1
  end
  local token = redis.call('INCR', KEYS[2])
  if token < 1 then
    -- A counter distlock did not write (a negative number): the grant is
    -- undone and 0 answered, which the caller reports.
    redis.call('DECR', KEYS[2])
    redis.call('DEL', KEYS[1])
    return 0
  end
  return token
end
-- The caller's own key: this same request sent again after its answer was
-- lost (a reconnect re-sends it). It holds the lock already: renewed and
-- granted again, not refused for the whole lease.
local function again()
  if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return true
  end
  return false
end
if not queued then
  if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) or again() then
    return granted()
  end
end
local waiting = ARGV[3] == '1' or ARGV[3] == '2'
local time = redis.call('TIME')
local micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now = math.floor(micros / 1000)
local behind = false
if queued then
  local ended = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 256)
  if #ended > 0 then
    redis.call('ZREM', queue, unpack(ended))
    redis.call('ZREM', KEYS[5], unpack(ended))
    if KEYS[6] then
      redis.call('ZREM', KEYS[6], unpack(ended))
    end
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  behind = head ~= nil and head ~= ARGV[6]
  if (not behind and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])) or again() then
    redis.call('ZREM', queue, ARGV[6])
    redis.call('ZREM', KEYS[5], ARGV[6])
    return granted()
  end
end
-- A holder that is not distlock's (a classic SET NX client) announces no
-- release, so its waiters are told to look again within 100 ms, not at its
-- expiry. distlock's value is 'distlock:shared' or an owner: a dashed
-- UUID, alone or before a space and the holder info.
local holder = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 100 and holder and holder ~= 'distlock:shared'
    and not (string.find(holder, '^%x%x%x%x%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%-%x%x%x%x%x%x%x%x%x%x%x%x')
      and (#holder == 36 or string.sub(holder, 37, 37) == ' ')) then
  pttl = 100
end
local held = -(pttl + 3)
local flags = 0
if waiting and queue then
  local life = tonumber(ARGV[5])
  local ends = now + life
  -- Written as a string: Lua prints numbers with 14 digits, fewer than
  -- the microseconds have.
  redis.call('ZADD', queue, 'NX', ARGV[7] or string.format('%.0f', micros), ARGV[6])
  redis.call('ZADD', KEYS[5], ends, ARGV[6])
  -- The queue lives as long as its longest entry.
  if redis.call('PTTL', queue) < life then
    redis.call('PEXPIRE', queue, life)
    redis.call('PEXPIRE', KEYS[5], life)
  end
  if behind then
    flags = 2
  end
end
if waiting and holder == 'distlock:shared' then
  local at = now
  redis.call('ZADD', KEYS[3], at + tonumber(ARGV[2]), ARGV[1])
  -- The set lives as long as its longest mark; each mark's own end is its
  -- score, pruned by shared_acquire.lua.
  local furthest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2]
  redis.call('PEXPIRE', KEYS[3], tonumber(furthest) - at)
  flags = flags + 1
end
if flags == 0 then
  return held
elseif flags == 1 then
  return { held }
end
return { held, flags }
