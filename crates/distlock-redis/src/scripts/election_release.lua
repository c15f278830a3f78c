-- KEYS[1] leader hash; ARGV[1] owner, ARGV[2] the election's channel.
-- Compare-and-delete, as release.lua: a leader whose lease expired finds
-- another owner here (or none) and deletes nothing. Answers 1 if the owner
-- still led until now, and only then tells the campaigners and observers.
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'resigned')
  return 1
end
return 0
