-- Prepended to the scripts of a semaphore's or an election's wait queue
-- (fifo): permit_acquire.lua, permit_release.lua, permit_leave.lua,
-- permit_limit.lua, permit_inspect.lua and the election_*.lua scripts
-- that grant or free a leadership. A queue is a sorted set of entries (a client id, a space,
-- and the owner) scored by arrival (microseconds of server time), beside a
-- sorted set of when each entry ends unless its waiter's next attempt
-- renews it (ms, server clock). With f permits free (one, a free
-- leadership), the first f live entries may each take one.

-- A semaphore's limit as stored (a string): the count, or -1 for text
-- distlock does not write (anything but a whole number from 1 to
-- 4294967295 in plain digits).
local function stored_count(text)
  if #text > 10 or not string.match(text, '^[1-9]%d*$') then
    return -1
  end
  local n = tonumber(text)
  if n > 4294967295 then
    return -1
  end
  return n
end

-- The server's time in ms.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- Puts `entry` in the queue at `place` (Redlock: the same on every node)
-- or, if nil, at the server's time now (`time`, as TIME answered it; `now`
-- the same in ms) unless it is there already, and has it end `life` ms
-- from now unless renewed; the queue lives as long as its longest entry.
local function join(queue, ends, entry, life, time, now, place)
  -- Written as a string: Lua prints numbers with 14 digits, fewer than
  -- the microseconds have.
  local micros = tonumber(time[1]) * 1000000 + tonumber(time[2])
  redis.call('ZADD', queue, 'NX', place or string.format('%.0f', micros), entry)
  redis.call('ZADD', ends, now + life, entry)
  if redis.call('PTTL', queue) < life then
    redis.call('PEXPIRE', queue, life)
    redis.call('PEXPIRE', ends, life)
  end
end

-- Drops the entries whose waiters stopped renewing them.
local function prune(queue, ends, now)
  local ended = redis.call('ZRANGEBYSCORE', ends, '-inf', now, 'LIMIT', 0, 256)
  if #ended > 0 then
    redis.call('ZREM', queue, unpack(ended))
    redis.call('ZREM', ends, unpack(ended))
  end
end

-- How many permits are free: the stored limit less the live permits (the
-- ended ones are dropped).
local function free_permits(permits, limit, now)
  local stored = tonumber(redis.call('GET', limit) or '0') or 0
  redis.call('ZREMRANGEBYSCORE', permits, '-inf', now)
  return stored - redis.call('ZCARD', permits)
end

-- How many entries are ahead of the one that arrived at `arrival` (all of
-- them for nil), counted up to `most`: whether a waiter is within reach
-- of the free permits needs no more. (ZRANK would count them all, and is
-- one more command for a least-privilege user to allow.)
local function ahead_of(queue, arrival, most)
  if most <= 0 then
    return 0
  end
  local upto = arrival and ('(' .. arrival) or '+inf'
  return #redis.call('ZRANGEBYSCORE', queue, '-inf', upto, 'LIMIT', 0, most)
end

-- Tells the entries at places first..last (0-based) that their turn has
-- come: 'next ' and the entry, on the entry's client's own channel
-- (`channel`, ':' and the client id), which no other client listens to.
-- At most 256 at once; any others try when they renew their entries.
local function tell(queue, channel, first, last)
  first = math.max(first, 0)
  if last < first then
    return
  end
  last = math.min(last, first + 255)
  for _, entry in ipairs(redis.call('ZRANGE', queue, first, last)) do
    local client = string.match(entry, '^(%S+) ')
    if client then
      redis.call('PUBLISH', channel .. ':' .. client, 'next ' .. entry)
    end
  end
end
