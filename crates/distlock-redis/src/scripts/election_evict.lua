-- KEYS[1] leader hash; ARGV[1] the election's channel. Deletes the
-- leadership whoever holds it, as an operator would, and tells the
-- campaigners and observers; the fencing counter stays. Answers 1 if
-- someone led.
if redis.call('DEL', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], 'evicted')
  return 1
end
return 0
