-- _lib.lua: prepended to every script. The one implementation of a lifecycle step.
--
-- A step is compare-and-set: it applies only when the task's current state is one of
-- spec.from (the Python transition table's sources for spec.to) and, when spec.fence is
-- given, the stored attempt equals it. Refusals are counted in the stats hash, never applied.
--
-- Spec fields:
--   id        task id                  to      target state      from   allowed current states
--   fence     attempt the caller holds (optional)
--   create    fields written only when the record does not exist (missing = unsubmitted)
--   set       fields to write          del     fields to delete
--   start     attempt += 1; stamps start_at (first start) or retry_at, and hb_at
--   delay_ms  to=scheduled: run_at = now + delay_ms (the scheduled index is scored by run_at)
--   lease_ms  also enter the publishing set with deadline now + lease_ms
--   ttl       seconds to keep the record once terminal; 0 = not terminal (PERSIST)
--   worker, reason   recorded on the history entry
--   ret       field names whose new values are returned

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- States whose records carry a TTL (terminal); leaving one must PERSIST the record.
local TERMINAL = {completed = true, failed = true, cancelled = true, stalled = true,
                  dropped = true}

-- ctx: {now, idx = {state -> index key}, all, publishing, stats, name_idx, queue_idx}
local function step(ctx, task, hist, spec)
  local now = ctx.now
  local got = redis.call('HMGET', task, 'state', 'attempt', 'start_at')
  local cur = got[1]
  local exists = cur ~= false
  if not exists then cur = 'unsubmitted' end
  local attempt = tonumber(got[2] or '0') or 0

  local function refuse(why)
    redis.call('HINCRBY', ctx.stats, 'refused', 1)
    redis.call('HINCRBY', ctx.stats, 'refused:' .. cur .. '>' .. spec.to, 1)
    return {0, exists and cur or 'missing', now, attempt, why}
  end

  local allowed = false
  for _, s in ipairs(spec.from) do
    if s == cur then allowed = true break end
  end
  if not allowed then return refuse('state') end
  if not exists and not spec.create then return refuse('missing') end
  if spec.fence and tonumber(spec.fence) ~= attempt then return refuse('stale_attempt') end

  -- Collect every field write and delete, then issue one HSET and at most one HDEL.
  local w = {'state', spec.to}
  local d = {}
  if not exists then
    for k, v in pairs(spec.create) do w[#w + 1] = k; w[#w + 1] = v end
    w[#w + 1] = 'attempt'; w[#w + 1] = 0
    w[#w + 1] = 'sub_at'; w[#w + 1] = now
    redis.call('ZADD', ctx.all, now, spec.id)
    if ctx.name_idx then redis.call('ZADD', ctx.name_idx, now, spec.id) end
    if ctx.queue_idx then redis.call('ZADD', ctx.queue_idx, now, spec.id) end
  end
  if spec.start then
    attempt = attempt + 1
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
    w[#w + 1] = 'hb_at'; w[#w + 1] = now
    w[#w + 1] = got[3] and 'retry_at' or 'start_at'; w[#w + 1] = now
    if spec.worker then w[#w + 1] = 'worker'; w[#w + 1] = spec.worker end
  end
  if spec.set then
    for k, v in pairs(spec.set) do w[#w + 1] = k; w[#w + 1] = v end
  end
  if spec.del then
    for _, f in ipairs(spec.del) do d[#d + 1] = f end
  end

  local score = now
  if spec.to == 'scheduled' then
    score = now + (tonumber(spec.delay_ms) or 0)
    w[#w + 1] = 'run_at'; w[#w + 1] = score
  elseif cur == 'scheduled' then
    d[#d + 1] = 'run_at'
  end
  local ttl = tonumber(spec.ttl) or 0
  if ttl > 0 then
    w[#w + 1] = 'done_at'; w[#w + 1] = now
  elseif TERMINAL[cur] then
    d[#d + 1] = 'done_at'  -- completed_at belongs to terminal states only
  end

  redis.call('HSET', task, unpack(w))
  if #d > 0 then redis.call('HDEL', task, unpack(d)) end

  redis.call('ZREM', ctx.idx[cur], spec.id)
  redis.call('ZADD', ctx.idx[spec.to], score, spec.id)
  if spec.lease_ms then
    redis.call('ZADD', ctx.publishing, now + tonumber(spec.lease_ms), spec.id)
  end

  redis.call('RPUSH', hist, cjson.encode({cur, spec.to, now, attempt,
    spec.worker or cjson.null, spec.reason or cjson.null}))
  if ttl > 0 then
    redis.call('EXPIRE', task, ttl)
    redis.call('EXPIRE', hist, ttl)
  elseif TERMINAL[cur] then
    redis.call('PERSIST', task)
    redis.call('PERSIST', hist)
  end

  local out = {1, exists and cur or 'missing', now, attempt}
  if spec.ret and #spec.ret > 0 then
    for _, v in ipairs(redis.call('HMGET', task, unpack(spec.ret))) do
      out[#out + 1] = v or ''
    end
  end
  return out
end

-- Shared KEYS layout of every script: KEYS[1] all-tasks index, KEYS[2] publishing set,
-- KEYS[3] stats hash, KEYS[4 .. 3+n] the per-state indexes the script may touch (a step:
-- those of its source states and its target), named in order by the JSON array ARGV[1].
-- Returns the context and the index of the first script-specific key.
local function context()
  local states = cjson.decode(ARGV[1])
  local ctx = {now = redis_now(), idx = {}, all = KEYS[1], publishing = KEYS[2],
               stats = KEYS[3]}
  for i, s in ipairs(states) do ctx.idx[s] = KEYS[3 + i] end
  return ctx, 4 + #states
end
