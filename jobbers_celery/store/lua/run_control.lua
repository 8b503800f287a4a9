-- run_control.lua: pause, resume, cancel or continue (a halted run) a paced resubmit
-- (compare-and-set on its status: of two operators pressing the same button, one moves the
-- run). The table is jobbers_celery.resubmit.pace.CONTROL's copy.
-- KEYS as run_settle.lua. ARGV[1] pause|resume|cancel|continue, ARGV[2] who (for the log),
-- ARGV[3] ms to keep a finished run.
-- Returns {1, new status} or {0, status now} ('' if there is no such run).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local sources = {pause = {queued = true, running = true}, resume = {paused = true},
                 cancel = {queued = true, running = true, paused = true},
                 continue = {halted = true}}
local targets = {pause = 'paused', resume = 'running', cancel = 'cancelled',
                 continue = 'running'}
local action = ARGV[1]
local status = redis.call('HGET', KEYS[1], 'status')
if not status then
  return {0, ''}
end
if not sources[action][status] then
  return {0, status}
end
local target = targets[action]
redis.call('HSET', KEYS[1], 'status', target)
local detail = ''
if action == 'resume' or action == 'continue' then
  -- the pace counts from now: a pause does not save up a burst
  redis.call('HSET', KEYS[1], 'paced_since', now, 'published_base',
             redis.call('HGET', KEYS[1], 'claimed') or '0')
end
if action == 'continue' then
  -- the stop rule starts over (the failures that halted it are not counted again), the
  -- run is driven again and kept as any moving run
  detail = 'after: ' .. (redis.call('HGET', KEYS[1], 'halt_reason') or '')
  redis.call('HSET', KEYS[1], 'halt_reason', '')
  redis.call('HDEL', KEYS[1], 'finished_at')
  redis.call('DEL', KEYS[5])
  for i = 1, 7 do
    redis.call('PERSIST', KEYS[i])
  end
  redis.call('SADD', KEYS[8], redis.call('HGET', KEYS[1], 'id'))
elseif action == 'cancel' then
  redis.call('HSET', KEYS[1], 'finished_at', now)
end
redis.call('RPUSH', KEYS[7], cjson.encode({at = now, action = action, by = ARGV[2],
                                           detail = detail}))
if action == 'cancel' and redis.call('ZCARD', KEYS[3]) == 0 then
  redis.call('SREM', KEYS[8], redis.call('HGET', KEYS[1], 'id'))
  for i = 1, 7 do
    redis.call('PEXPIRE', KEYS[i], ARGV[3])
  end
end
return {1, target}
