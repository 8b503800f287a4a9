-- drop_payload.lua: a dead-letter entry now holds the publish payload of these tasks, so
-- their records forget their own copy (field msg). Compare-and-set per record: only a record
-- still failed, stalled or dropped at the attempt that was dead-lettered loses it; one that
-- was resubmitted meanwhile (or started again) needs its payload and keeps it.
-- Only commands of the documented ACL rule (docs/howto/topologies.md).
-- KEYS: task hashes. ARGV[1]: ms a terminal record is kept after done_at (its expiry);
-- ARGV[1 + i]: the dead-lettered attempt of KEYS[i].
-- Returns how many records dropped their payload.
local dead = {failed = true, stalled = true, dropped = true}
local keep_ms = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local dropped = 0
for i, task in ipairs(KEYS) do
  local got = redis.call('HMGET', task, 'state', 'attempt', 'done_at')
  if got[1] and dead[got[1]] and got[2] == ARGV[i + 1]
      and redis.call('HDEL', task, 'msg') == 1 then
    -- Rewrite the hash: Redis never gives a hash its compact encoding back once a long value
    -- (the payload) made it a hashtable (as _lib.lua's step does); DEL drops the expiry, so
    -- set it again: done_at + keep_ms, as the step that ended the task set it.
    local all = redis.call('HGETALL', task)
    redis.call('DEL', task)
    redis.call('HSET', task, unpack(all))
    local left = (tonumber(got[3] or '') or now) + keep_ms - now
    redis.call('PEXPIRE', task, math.max(left, 1))
    dropped = dropped + 1
  end
end
return dropped
