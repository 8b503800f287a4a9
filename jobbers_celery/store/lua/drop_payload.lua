-- drop_payload.lua: a dead-letter entry now holds the publish payload of these tasks, so
-- their records forget their own copy (field msg). Compare-and-set per record: only a record
-- still failed, stalled or dropped at the attempt that was dead-lettered loses it; one that
-- was resubmitted meanwhile (or started again) needs its payload and keeps it.
-- KEYS: task hashes. ARGV[i]: the dead-lettered attempt of KEYS[i].
-- Returns how many records dropped their payload.
local dead = {failed = true, stalled = true, dropped = true}
local dropped = 0
for i, task in ipairs(KEYS) do
  local got = redis.call('HMGET', task, 'state', 'attempt')
  if got[1] and dead[got[1]] and got[2] == ARGV[i]
      and redis.call('HEXISTS', task, 'msg') == 1 then
    redis.call('HDEL', task, 'msg')
    -- Rewrite the hash, keeping its expiry: Redis never gives a hash its compact encoding
    -- back once a long value (the payload) made it a hashtable (same as _lib.lua's step).
    local ttl = redis.call('PTTL', task)
    local all = redis.call('HGETALL', task)
    redis.call('DEL', task)
    redis.call('HSET', task, unpack(all))
    if ttl > 0 then redis.call('PEXPIRE', task, ttl) end
    dropped = dropped + 1
  end
end
return dropped
