-- _lib.lua: prepended to every script. The one implementation of a lifecycle step.
--
-- A step is compare-and-set: it applies only when the task's current state is one of
-- spec.from (the Python transition table's sources for spec.to) and, when spec.fence is
-- given, the stored attempt equals it. Refusals are counted in the stats hash, never applied.
--
-- Spec fields:
--   id        task id                  to      target state      from   allowed current states
--   fence     attempt the caller holds (optional)
--   wid_fence the worker incarnation the caller is (optional): refused if another one runs it
--   giver     {gone_ms, settle_ms} with wid_fence: the take-back of a start worker
--             incarnation wid_fence holds (a message it gave back names it; a header is never
--             trusted alone): applied only if that incarnation is gone (not seen in the
--             workers set for gone_ms, counted from the clock's resumed_at when later, as the
--             cleaner counts; ctx.clock), or its own liveness refresh said it does not run
--             that attempt (its not-running hash, ctx.notrun, names the attempt's start; see
--             alive.lua). Else refused 'giver_alive' while that refresh may still come (the
--             attempt started less than settle_ms before the giver was last seen), then
--             'giver_runs_it'
--   gone_fence with fence: refused unless the attempt is the one its own worker said it does
--             not run (field gone, written by stall.lua's verdict "gone")
--   create    fields written only when the record does not exist (missing = unsubmitted)
--   set       fields to write          del     fields to delete
--   start     attempt += 1; stamps start_at (first start) or retry_at, and hb_at
--   bump      attempt += 1 without starting (a worker judged the delivery and dropped it),
--             so that every dead letter of a task has its own (task id, attempt)
--   wid       with start: the worker incarnation running it (enters its worker-tasks set)
--   reg       with wid: also enter the incarnation in the workers set (the first start a
--             process makes; the liveness thread keeps it there afterwards)
--   hb_ms     with start: max_heartbeat_interval (enters the heartbeat-deadline index;
--             recorded as hb_iv)
--   cap, lease_cap_ms, defer_ms   with start: max_concurrent; over the cap the task is
--             deferred (to = scheduled after defer_ms) instead of started; a started task
--             holding a lease is marked (field cap) so that its end releases it
--   cap_held  (sharded layout) the lease was asked for in the global slot before this
--             step (conc.lua): true taken, false the cap was full (deferred)
--   split     (sharded layout) an attempt holding a lease that ends does not release it
--             here (another slot): the record's name is returned after the ret values
--             ('' when it held none) for the caller to release it
--   cancellable  if cancellation was requested, go to cancelled instead of spec.to
--             (history reason: cancel_reason if given)
--             Whenever a step ends a task flagged for cancellation in cancelled, the reason
--             the request kept (field cxl: a Celery revoke, see cancel.lua) heads the
--             history reason.
--   delay_ms  to=scheduled: run_at = now + delay_ms (the scheduled index is scored by run_at)
--   lease_ms  also enter the publishing set with deadline now + lease_ms
--   ttl       seconds to keep the record if the step ends in a terminal state
--   worker, reason   recorded on the history entry
--   ret       field names whose new values are returned (read with the state, so a step
--             costs one read whatever it returns)
--
-- Returns {1, state before ("missing"), now_ms, attempt, state after, ret...} when applied,
-- {0, state before, now_ms, attempt, why} when refused.

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A sign of life: a worker's liveness refresh (every ~2 s while any worker lives) or a
-- cleaner pass (every cleaner interval). A silence longer than expected means nobody could
-- reach Redis (outage, pause, restart): resumed_at is set, and stall verdicts count silence
-- from then on, not from before. Expected: gap_ms after a tick while workers were ticking,
-- cgap_ms (a few cleaner intervals) otherwise, when only cleaner passes tick.
-- Another server than the one that answered last (a restart, or a failover to a replica):
-- nobody could report while it changed, and the last writes before it may be lost (AOF
-- everysec, asynchronous replication), heartbeats and liveness refreshes among them; so it
-- counts as an outage whatever the silence, and resumed_at is set. Returns true then.
-- INFO is the one command of Redis's @dangerous category jobbers uses; a user not granted it
-- (ACL) gets no restart detection here, only the silence-based one in tick().
-- The server's run_id is read once per script run (a scan of several shards' clocks on one
-- server asks INFO once).
local server_id = nil
local function new_server(clock, now)
  if server_id == nil then
    local info = redis.pcall('INFO', 'server')
    server_id = type(info) == 'string' and string.match(info, 'run_id:(%x+)') or false
  end
  if not server_id then return false end
  local id = server_id
  local known = redis.call('HGET', clock, 'run_id')
  if known == id then return false end
  redis.call('HSET', clock, 'run_id', id)
  if not known then return false end
  local last = tonumber(redis.call('HGET', clock, 'tick') or '')
  redis.call('HSET', clock, 'resumed_at', now, 'gap_ms', last and (now - last) or -1)
  return true
end

local function tick(clock, now, gap_ms, cgap_ms, from_worker)
  local got = redis.call('HMGET', clock, 'tick', 'wtick')
  local last, lastw = tonumber(got[1] or ''), tonumber(got[2] or '')
  gap_ms, cgap_ms = tonumber(gap_ms), tonumber(cgap_ms)
  local silent = last and (now - last) or -1
  if new_server(clock, now) then
    -- resumed_at is set
  elseif not last or silent > cgap_ms
      or (silent > gap_ms and lastw and last - lastw <= gap_ms) then
    redis.call('HSET', clock, 'resumed_at', now, 'gap_ms', silent)
  end
  local w = {}
  if not last or now > last then w[#w + 1] = 'tick'; w[#w + 1] = now end
  if from_worker then w[#w + 1] = 'wtick'; w[#w + 1] = now end
  if #w > 0 then redis.call('HSET', clock, unpack(w)) end
end

-- ms since the epoch -> ISO 8601 UTC (for the evidence written into history reasons)
local function iso(ms)
  ms = tonumber(ms)
  if not ms then return 'never' end
  local s = math.floor(ms / 1000)
  local days = math.floor(s / 86400)
  local rem = s - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524)
    - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600),
    math.floor((rem % 3600) / 60), rem % 60, ms % 1000)
end

-- States whose records carry a TTL (terminal); leaving one must PERSIST the record.
local TERMINAL = {completed = true, failed = true, cancelled = true, stalled = true,
                  dropped = true}

-- ctx: {now, idx = {state -> index key}, all, publishing, stats, hbdue, wtasks, conc,
--       workers, name_idx}
local function step(ctx, task, spec)
  local now = ctx.now
  local ret = spec.ret or {}
  local got = redis.call('HMGET', task, 'state', 'attempt', 'start_at', 'cancel', 'wid', 'hn',
    'sub_at', 'worker', 'hb_iv', 'cap', unpack(ret))
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
  if spec.wid_fence and got[5] ~= spec.wid_fence then return refuse('other_worker') end
  if spec.giver then
    local seen = tonumber(redis.call('ZSCORE', ctx.workers, spec.wid_fence) or '')
    local resumed = tonumber(redis.call('HGET', ctx.clock, 'resumed_at') or '0') or 0
    if seen and now - math.max(seen, resumed) <= tonumber(spec.giver.gone_ms) then
      local started = tonumber(redis.call('HGET', task, 'retry_at') or '')
        or tonumber(got[3] or '0') or 0
      local said = tonumber(redis.call('HGET', ctx.notrun, spec.id) or '')
      if said ~= started then
        if seen - started > tonumber(spec.giver.settle_ms) then
          return refuse('giver_runs_it')
        end
        return refuse('giver_alive')
      end
    end
  end
  if spec.gone_fence and redis.call('HGET', task, 'gone') ~= tostring(attempt) then
    return refuse('not_given_back')
  end

  local to, reason, start = spec.to, spec.reason, spec.start
  local delay_ms = spec.delay_ms
  if spec.cancellable and got[4] then
    to, start = 'cancelled', false
    reason = spec.cancel_reason or
      ('cancellation requested' .. (reason and ('; ' .. reason) or ''))
  elseif start and spec.cap then
    local full
    if spec.cap_held ~= nil then
      full = not spec.cap_held  -- sharded: the lease was asked for in the global slot first
    else
      redis.call('ZREMRANGEBYSCORE', ctx.conc, '-inf', now)  -- leases of dead holders
      full = not redis.call('ZSCORE', ctx.conc, spec.id)
        and redis.call('ZCARD', ctx.conc) >= tonumber(spec.cap)
    end
    if full then
      to, start, delay_ms = 'scheduled', false, spec.defer_ms
      reason = 'max_concurrent=' .. spec.cap .. ' reached: deferred, no retry used'
    end
  end
  if to == 'cancelled' and got[4] then
    local why = redis.call('HGET', task, 'cxl')  -- only on this rare path: not in the HMGET
    if why then reason = why .. '; ' .. (reason or 'cancelled') end
  end
  local terminal = TERMINAL[to]

  -- Collect every field write and delete, then issue one HSET and at most one HDEL.
  local w = {'state', to}
  local d = {}
  if not exists then
    -- create.attempt: a record made again (its dead letter's resubmit) counts on from it
    attempt = tonumber(spec.create.attempt or '0') or 0
    for k, v in pairs(spec.create) do
      if k ~= 'attempt' then w[#w + 1] = k; w[#w + 1] = v end
    end
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
    w[#w + 1] = 'sub_at'; w[#w + 1] = now
    redis.call('ZADD', ctx.all, now, spec.id)
    if ctx.name_idx then redis.call('ZADD', ctx.name_idx, now, spec.id) end
  end
  if spec.bump and not start then
    attempt = attempt + 1
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
  end
  if start then
    attempt = attempt + 1
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
    w[#w + 1] = 'hb_at'; w[#w + 1] = now
    w[#w + 1] = got[3] and 'retry_at' or 'start_at'; w[#w + 1] = now
    if spec.worker then w[#w + 1] = 'worker'; w[#w + 1] = spec.worker end
    if spec.wid then
      w[#w + 1] = 'wid'; w[#w + 1] = spec.wid
      redis.call('ZADD', ctx.wtasks, now, spec.id)
      -- known from its first task on, even if it dies before its first liveness refresh
      if spec.reg then redis.call('ZADD', ctx.workers, 'NX', now, spec.wid) end
    end
    if spec.hb_ms then
      -- hb_iv marks the record as owing heartbeats (heartbeat.lua and the end of the
      -- attempt read it): written with the deadline, so the two never disagree
      redis.call('ZADD', ctx.hbdue, now + tonumber(spec.hb_ms), spec.id)
      w[#w + 1] = 'hb_iv'; w[#w + 1] = spec.hb_ms
    end
    if spec.cap then
      if spec.cap_held == nil then
        redis.call('ZADD', ctx.conc, now + tonumber(spec.lease_cap_ms), spec.id)
      end
      w[#w + 1] = 'cap'; w[#w + 1] = spec.cap
    end
    if spec.set then
      for k, v in pairs(spec.set) do w[#w + 1] = k; w[#w + 1] = v end
    end
  elseif spec.set and to == spec.to then
    for k, v in pairs(spec.set) do w[#w + 1] = k; w[#w + 1] = v end
  end
  if spec.del and to == spec.to then
    for _, f in ipairs(spec.del) do d[#d + 1] = f end
  end
  if cur == 'started' and to ~= 'started' then
    -- the running attempt ends: it no longer owes heartbeats nor holds a lease (only a
    -- task with a heartbeat interval is in hbdue, only one marked cap holds a lease)
    if got[9] then redis.call('ZREM', ctx.hbdue, spec.id) end
    redis.call('ZREM', ctx.wtasks, spec.id)
    if got[10] then
      if spec.split then
        -- sharded: the lease is in the global slot; the caller releases it (name returned)
        ctx.freed = redis.call('HGET', task, 'name') or ''
      else
        redis.call('ZREM', ctx.conc, spec.id)
      end
      if not start then d[#d + 1] = 'cap' end
    end
  end

  local score = now
  if to == 'scheduled' then
    score = now + (tonumber(delay_ms) or 0)
    w[#w + 1] = 'run_at'; w[#w + 1] = score
  elseif cur == 'scheduled' then
    d[#d + 1] = 'run_at'
  end
  local ttl = terminal and (tonumber(spec.ttl) or 0) or 0
  if terminal then
    w[#w + 1] = 'done_at'; w[#w + 1] = now
    if got[4] then d[#d + 1] = 'cancel'; d[#d + 1] = 'cxl' end
  elseif TERMINAL[cur] then
    d[#d + 1] = 'done_at'  -- completed_at belongs to terminal states only
  end

  -- The history lives in the record, kept short so that a finished record stays a compact
  -- listpack (every value <= 64 bytes): h<n> = "<to>|<ms since sub_at>|<attempt>|<worker,
  -- or * for the record's worker field>|<reason>"; the from state is the previous entry's to
  -- (unsubmitted for h1). A start by another worker first spells out the old worker in the
  -- entries that said *, so that * always means the current worker field.
  local n = (tonumber(got[6] or '0') or 0) + 1
  local worker = spec.worker or ''
  local current = got[8]
  if start and spec.worker then
    if current and current ~= spec.worker then
      for i = 1, n - 1 do
        local e = redis.call('HGET', task, 'h' .. i)
        local a, b, c, tok, r = string.match(e or '', '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
        if tok == '*' then
          redis.call('HSET', task, 'h' .. i, a .. '|' .. b .. '|' .. c .. '|' .. current .. '|' .. r)
        end
      end
    end
    current = spec.worker
  end
  if worker ~= '' and worker == current then worker = '*' end
  w[#w + 1] = 'h' .. n
  w[#w + 1] = to .. '|' .. (now - (tonumber(got[7] or '') or now)) .. '|' .. attempt .. '|'
    .. worker .. '|' .. (reason or '')
  w[#w + 1] = 'hn'; w[#w + 1] = n

  redis.call('HSET', task, unpack(w))
  local compact = false
  if #d > 0 then
    redis.call('HDEL', task, unpack(d))
    for _, f in ipairs(d) do if f == 'msg' then compact = true end end
  end
  if compact then
    -- Redis never converts a hash back to its compact encoding once a long value (msg)
    -- made it a hashtable; rewriting it does, when every value left is short (~2x smaller)
    local all = redis.call('HGETALL', task)
    redis.call('DEL', task)
    redis.call('HSET', task, unpack(all))
  end

  if exists then redis.call('ZREM', ctx.idx[cur], spec.id) end
  redis.call('ZADD', ctx.idx[to], score, spec.id)
  if spec.lease_ms then
    redis.call('ZADD', ctx.publishing, now + tonumber(spec.lease_ms), spec.id)
  end

  if ttl > 0 then
    redis.call('EXPIRE', task, ttl)
  elseif TERMINAL[cur] then
    redis.call('PERSIST', task)
  end

  local out = {1, exists and cur or 'missing', now, attempt, to}
  if #ret > 0 then
    -- the values after the step: what it wrote or deleted, else what was read before it
    local after = {}
    for i = 1, #ret do after[ret[i]] = got[10 + i] or '' end
    for i = 1, #w, 2 do if after[w[i]] then after[w[i]] = w[i + 1] end end
    for _, f in ipairs(d) do if after[f] then after[f] = '' end end
    for i = 1, #ret do out[#out + 1] = after[ret[i]] end
  end
  if spec.split then
    out[#out + 1] = ctx.freed or ''
    ctx.freed = nil
  end
  return out
end

-- Shared KEYS layout of every script: KEYS[1] all-tasks index, KEYS[2] publishing set,
-- KEYS[3] stats hash, KEYS[4] heartbeat-deadline index, KEYS[5] the worker-tasks set of the
-- worker incarnation involved, KEYS[6] the concurrency-lease set of the task's name (5 and 6
-- are placeholders when not involved), KEYS[7] the workers set, KEYS[8 .. 7+n] the per-state
-- indexes the script may touch (a step: those of its source states and its targets), named
-- in order by the JSON array ARGV[1]. Returns the context and the index of the first
-- script-specific key.
local function context()
  local states = cjson.decode(ARGV[1])
  local ctx = {now = redis_now(), idx = {}, all = KEYS[1], publishing = KEYS[2],
               stats = KEYS[3], hbdue = KEYS[4], wtasks = KEYS[5], conc = KEYS[6],
               workers = KEYS[7]}
  for i, s in ipairs(states) do ctx.idx[s] = KEYS[7 + i] end
  return ctx, 8 + #states
end
