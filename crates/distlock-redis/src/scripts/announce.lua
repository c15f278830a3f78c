-- Prepended to the scripts that free a lock (release.lua,
-- shared_release.lua). announce(lock, channel, queue, ends) tells the
-- waiters: the lock key on `channel` (readers and waiters without a queue
-- entry listen there), and, if the lock's wait queue `queue` (with the
-- entries' ends `ends`, see acquire.lua) has a live head, 'next ' and the
-- head's entry on the channel of the head's client (`channel`, ':' and the
-- client id the entry starts with), which no other client listens to: one
-- delivery, one waiter woken. A head that is `skip` (the entry of the
-- waiter that frees the lock and stays first) is not woken.
local function announce(lock, channel, queue, ends, skip)
  redis.call('PUBLISH', channel, lock)
  if not queue or redis.call('EXISTS', queue) == 0 then
    return
  end
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local ended = redis.call('ZRANGEBYSCORE', ends, '-inf', now, 'LIMIT', 0, 256)
  if #ended > 0 then
    redis.call('ZREM', queue, unpack(ended))
    redis.call('ZREM', ends, unpack(ended))
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and head ~= skip then
    local client = string.match(head, '^(%S+) ')
    if client then
      redis.call('PUBLISH', channel .. ':' .. client, 'next ' .. head)
    end
  end
end
