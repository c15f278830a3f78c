-- KEYS[1] leader (hash: owner, value, token; expiring as a whole with the
-- leadership's lease, by this server's clock), KEYS[2] fencing counter;
-- ARGV[1] owner, ARGV[2] TTL in ms, ARGV[3] the campaign's value,
-- ARGV[4] the election's channel; with a wait queue (fifo, see
-- wait_queue.lua) KEYS[3] the queue, KEYS[4] its entries' ends, ARGV[5]
-- '1' for an attempt of a wait (refused, it joins the queue or renews its
-- entry) and '0' for a try, ARGV[6] how long the entry lasts (ms) unless
-- the waiter's next attempt renews it, ARGV[7] the caller's entry,
-- ARGV[8], if given, the entry's place (Redlock: the same on every node).
-- With a queue, a free leadership goes to its head alone (to a caller not
-- queued only while nobody is).
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
local queue = KEYS[3]
local led = redis.call('EXISTS', KEYS[1]) == 1
if not queue then
  if led then
    return -(redis.call('PTTL', KEYS[1]) + 3)
  end
else
  local queued, ahead = false, 0
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  if redis.call('EXISTS', queue) == 1 then
    prune(queue, KEYS[4], now)
    local arrival = redis.call('ZSCORE', queue, ARGV[7])
    queued = arrival ~= false
    ahead = ahead_of(queue, arrival or nil, 1)
  end
  if led or ahead > 0 then
    local life = tonumber(ARGV[6])
    if ARGV[5] == '1' then
      join(queue, KEYS[4], ARGV[7], life, time, now, ARGV[8])
    end
    if ahead > 0 then
      -- Behind another waiter: nothing to try at the lease's end; back to
      -- renew the entry.
      return -(math.floor(life / 3) + 3)
    end
    return -(redis.call('PTTL', KEYS[1]) + 3)
  end
  if queued then
    redis.call('ZREM', queue, ARGV[7])
    redis.call('ZREM', KEYS[4], ARGV[7])
  end
end
local token = redis.call('INCR', KEYS[2])
if token < 1 then
  -- A counter distlock did not write (a negative number): nothing is
  -- granted, and 0 answered, which the caller reports.
  redis.call('DECR', KEYS[2])
  return 0
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'value', ARGV[3], 'token', token)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], 'granted')
return token
