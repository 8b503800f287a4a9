-- rl.lua: rate_limit_by in the sharded layout, where a key's window lives in the global
-- slot and a task's start step in its shard's: the room is asked for here first, then the
-- start step runs, told the wait (0: admitted here); a start that did not happen gives its
-- entry back ('give'). The arithmetic is _lib.lua's rate_wait, the same as on one slot.
-- KEYS[1] the key's window, KEYS[2] the overrides hash, KEYS[3] the key's waiting set,
-- KEYS[4] the name's held set
-- ARGV[1] 'take': ARGV[2] task id, ARGV[3] the declared rate, ARGV[4] task name, ARGV[5]
--         how long a waiter keeps its place past its run_at (ms);
--         'give': ARGV[2] the member 'take' returned
-- Returns take: {wait ms (0 admitted), rate applied, member ('' when not admitted)}
local now = redis_now()
if ARGV[1] == 'give' then
  redis.call('ZREM', KEYS[1], ARGV[2])
  return 0
end
local rl = {lim = ARGV[3], name = ARGV[4], g = ARGV[5]}
local wait, lim = rate_wait(rl, KEYS, ARGV[2], now)
if wait then
  rate_defer(rl, KEYS, ARGV[2], now, wait)
  return {wait, lim, ''}
end
if not rl.p then return {0, 'off', ''} end
-- the attempt is not known here: the member is the id and the time, unique per take (a
-- duplicate delivery in the same ms takes another, so that giving one back leaves the other)
local at, i = tostring(now), 0
while redis.call('ZSCORE', KEYS[1], ARGV[2] .. ':' .. at) do
  i = i + 1
  at = now .. '.' .. i
end
return {0, rl.lim, rate_take(rl, KEYS, ARGV[2], at, now)}
