-- conc.lua: max_concurrent leases in the sharded layout, where they live in the global slot
-- and a task's start step in its shard's: the lease is taken here first, then the start
-- step runs (told whether it was taken), so the cap is never exceeded; a start that did not
-- happen releases it (ZREM), and so does the end of the attempt (its step returns the name).
-- KEYS[1] the concurrency-lease set of one task name
-- ARGV[1] 'take' or 'renew', ARGV[2] lease ms, then take: cap, task id; renew: task ids
-- Returns take: 1 if the task took a lease now, 2 if it held one already (another delivery
-- of a task that runs: its start is refused, and the lease stays its running attempt's),
-- 0 if the cap is reached; renew: 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local until_ms = now + tonumber(ARGV[2])
if ARGV[1] == 'take' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)  -- leases of dead holders
  if redis.call('ZSCORE', KEYS[1], ARGV[4]) then
    redis.call('ZADD', KEYS[1], until_ms, ARGV[4])
    return 2
  end
  if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
    redis.call('ZADD', KEYS[1], until_ms, ARGV[4])
    return 1
  end
  return 0
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])
end
return 0
