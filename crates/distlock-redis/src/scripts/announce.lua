-- Prepended to the scripts that free a lock (release.lua,
-- shared_release.lua). announce(lock, channel, queue, ends) tells the
-- waiters: the lock key on `channel` (readers and waiters without a queue
-- entry listen there), and, if the lock's wait queue `queue` (with the
-- entries' ends `ends`, see acquire.lua) has a live head, 'next ' and the
-- head's entry on the channel of the head's client (`channel`, ':' and the
-- client id the entry starts with), which no other client listens to: one
-- delivery, one waiter woken. A head that is `skip` (the entry of the
-- waiter that frees the lock and stays first) is not woken. Where the
-- queue's shared entries are kept (`shared`, see shared_acquire.lua), a
-- head that is a shared request is told with every shared request queued
-- right behind it, up to the first exclusive one: they hold together.
local function tell_entry(channel, entry)
  local client = string.match(entry, '^(%S+) ')
  if client then
    redis.call('PUBLISH', channel .. ':' .. client, 'next ' .. entry)
  end
end
local function announce(lock, channel, queue, ends, skip, shared)
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
    if shared then
      redis.call('ZREM', shared, unpack(ended))
    end
  end
  if shared and redis.call('EXISTS', shared) == 1 then
    for i, entry in ipairs(redis.call('ZRANGE', queue, 0, 255)) do
      local reader = redis.call('ZSCORE', shared, entry)
      if not reader and i > 1 then
        return
      end
      if entry ~= skip then
        tell_entry(channel, entry)
      end
      if not reader then
        return
      end
    end
    return
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and head ~= skip then
    tell_entry(channel, head)
  end
end
