-- run_settle.lua: record outcomes of a paced resubmit's claimed entries, then apply its stop
-- rule and see whether it is done.
-- KEYS (see RedisStore.run_keys): [1] run hash, [2] pending list, [3] unsettled zset,
-- [4] claiming zset, [5] window list (newest settled outcome first), [6] notes hash,
-- [7] log list, [8] the set of runs to drive.
-- ARGV[1] JSON [[member, code, note], ...]; ARGV[2] the window's length; ARGV[3] ms to keep a
-- finished run; ARGV[4] the run's id. Codes: p (published: no longer only claimed),
-- c completed, f failed again, o ended otherwise, s skipped (not published: the task was not
-- resubmittable), x publish failed. An outcome counts once: the member must still be
-- unsettled (ZREM is the guard).
-- Returns {status, what changed ('' if nothing)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  -- gone (deleted by hand): nothing left to drive
  redis.call('SREM', KEYS[8], ARGV[4])
  return {'', ''}
end
local field = {c = 'completed', f = 'failed_again', o = 'ended_otherwise', s = 'skipped',
               x = 'publish_failed'}
for _, o in ipairs(cjson.decode(ARGV[1])) do
  local member, code, note = o[1], o[2], o[3]
  if code == 'p' then
    redis.call('ZREM', KEYS[4], member)
  elseif field[code] and redis.call('ZREM', KEYS[3], member) == 1 then
    redis.call('ZREM', KEYS[4], member)
    redis.call('HINCRBY', KEYS[1], field[code], 1)
    if code == 'c' or code == 'f' or code == 'o' then
      redis.call('LPUSH', KEYS[5], code)
    end
    if type(note) == 'string' and note ~= '' then
      redis.call('HSET', KEYS[6], member, code .. '|' .. note)
    end
  end
end
redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[2]) - 1)
local changed = ''
if status == 'running' then
  local x = tonumber(redis.call('HGET', KEYS[1], 'halt_after') or '')
  local n = tonumber(redis.call('HGET', KEYS[1], 'of_last') or '')
  if x and n then
    local last = redis.call('LRANGE', KEYS[5], 0, n - 1)
    local failed = 0
    for _, code in ipairs(last) do
      if code == 'f' then
        failed = failed + 1
      end
    end
    if failed > x then
      changed = failed .. ' of the last ' .. #last .. ' resubmitted tasks failed again (the '
        .. 'rule: halt when more than ' .. x .. ' of the last ' .. n .. ')'
      status = 'halted'
      redis.call('HSET', KEYS[1], 'status', status, 'halt_reason', changed, 'finished_at', now)
    end
  end
  if status == 'running' and redis.call('LLEN', KEYS[2]) == 0
      and redis.call('ZCARD', KEYS[3]) == 0 then
    status = 'done'
    changed = 'every entry published and settled'
    redis.call('HSET', KEYS[1], 'status', status, 'finished_at', now)
  end
  if changed ~= '' then
    redis.call('RPUSH', KEYS[7], cjson.encode({at = now, action = status, by = 'pacer',
                                               detail = changed}))
  end
end
local final = status == 'halted' or status == 'cancelled' or status == 'done'
if final and redis.call('ZCARD', KEYS[3]) == 0 then
  -- nothing left to follow: no more passes; the run is kept for the retention period
  redis.call('SREM', KEYS[8], ARGV[4])
  for i = 1, 7 do
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
return {status, changed}
