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
--   create    fields written only when the record does not exist (missing = unsubmitted),
--             or when it is unsubmitted by a replace() (field rpl: see below)
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
--   fair      with cap: the cap is per concurrency key (fair shares, see the fair section
--             below): {c, p, r, i, caps: its keys; m: its index member; d8: the digest's
--             first 8 digits; park_ms}; over it the task is parked, not deferred
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

-- A silence shorter than an outage but longer than 1.5 refresh periods (gap_ms / 2; a live
-- worker refreshes every period, a little over it as seen by Redis) is kept as the clock's
-- last quiet window (quiet_from, quiet_to): nobody reached Redis then, so a task's
-- heartbeats may have been refused too; a heartbeat verdict (stall.lua) does not count it.
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
  elseif silent > gap_ms / 2 then
    redis.call('HSET', clock, 'quiet_from', last, 'quiet_to', now)
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

-- Per-minute series (jobbers_celery/core/series.py has the rules, store/keys.py the key
-- names, which the loader puts in SERIES_HOUR, SERIES_DAY and SERIES_CONF below): every
-- step that ends an attempt, or ends a task as a failure, adds to the minute of `now` in two
-- hour hashes of the task's hash tag: its name's (kind n) and its queue's (q); the total is the
-- sum of the queues'. Field: the minute of the hour ('0'..'59'); value: "s ql e rt n f r"
-- (starts, their queue latency ms summed, attempts ended, their runtime ms summed,
-- completed, failed: failed/stalled/dropped, retried: an attempt ended to run again).
-- 60 short fields keep each hash a listpack. Only the first event of a name's minute reads
-- the settings (days, cap), sets the hour's expiry and checks the day's index of names:
-- past `cap` names a day, a new name counts under SERIES_OTHER. Names are cut to SERIES_LEN
-- bytes.
local SERIES_HOUR, SERIES_DAY, SERIES_CONF = '$SERIES_HOUR', '$SERIES_DAY', '$SERIES_CONF'
local SERIES_LEN = 200
local SERIES_OTHER = '~other'
local SERIES_FAILED = {failed = true, stalled = true, dropped = true}

-- a name cut to SERIES_LEN bytes loses its last character, which the cut may have split
local function series_bound(name)
  if #name <= SERIES_LEN then return name end
  return (string.gsub(string.sub(name, 1, SERIES_LEN), '[\192-\255][\128-\191]*$', ''))
end

local function series_add(ctx, ns, kind, name, now, d)
  local hour = math.floor(now / 3600000)
  local minute = tostring(math.floor(now / 60000) % 60)
  local key = ns .. string.format(SERIES_HOUR, kind, hour) .. name
  local old = redis.call('HGET', key, minute)
  local keep = nil
  if not old then
    local conf = ctx.ser_conf
    if not conf then
      local c = redis.call('HMGET', ns .. SERIES_CONF, 'days', 'cap')
      -- whole seconds for EXPIRE (a fraction of a day is refused as not an integer)
      local days, cap = tonumber(c[1] or ''), tonumber(c[2] or '')
      conf = {math.floor(((days and days > 0) and days or 7) * 86400),
              math.floor((cap and cap >= 1) and cap or 200)}
      ctx.ser_conf = conf
    end
    keep = (hour + 1) * 3600 + conf[1] - math.floor(now / 1000)
    if kind ~= 't' then
      local idx = ns .. string.format(SERIES_DAY, kind, math.floor(now / 86400000))
      -- a sorted set (score: the name's first minute), not a set: the documented ACL rule
      -- grants zscore/zcard/zadd already, and no set command beyond sadd/srem/smembers
      if not redis.call('ZSCORE', idx, name) then
        if redis.call('ZCARD', idx) >= conf[2] then
          name = SERIES_OTHER
          key = ns .. string.format(SERIES_HOUR, kind, hour) .. name
          old = redis.call('HGET', key, minute)
        end
        redis.call('ZADD', idx, 'NX', now, name)
        redis.call('EXPIRE', idx, conf[1] + 86400)
      end
    end
  end
  -- one match and one format (no table, no loop): this runs at the end of every task
  local a, b, c, e, f, g, h = string.match(old or '',
    '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')
  redis.call('HSET', key, minute, string.format('%d %d %d %d %d %d %d',
    (tonumber(a) or 0) + d[1], (tonumber(b) or 0) + d[2], (tonumber(c) or 0) + d[3],
    (tonumber(e) or 0) + d[4], (tonumber(f) or 0) + d[5], (tonumber(g) or 0) + d[6],
    (tonumber(h) or 0) + d[7]))
  if keep then redis.call('EXPIRE', key, keep) end  -- the hour's first write made the key
end

-- An attempt counts when it ends (its start's queue latency, field ql, with it): one write
-- per series a task, at its last step. got: step()'s HMGET (3 start_at, 11 name, 12 queue,
-- 13 ql, 14 retry_at).
local function series_step(ctx, task, cur, to, got, attempt, now)
  local d
  if cur == 'started' and to ~= 'started' then
    local began = tonumber(got[3] or '')
    if attempt > 1 then began = tonumber(got[14] or '') or began end
    local ql = tonumber(got[13] or '')
    local retried = (to == 'scheduled' or to == 'unsubmitted') and 1 or 0
    d = {ql and 1 or 0, ql or 0, 1, began and math.max(0, now - began) or 0,
         to == 'completed' and 1 or 0, SERIES_FAILED[to] and 1 or 0, retried}
  elseif SERIES_FAILED[to] then
    d = {0, 0, 0, 0, 0, 1, 0}
  else
    return
  end
  local ns = string.match(task, '^{[^}]*}')
  series_add(ctx, ns, 'n', series_bound(got[11] or ''), now, d)
  series_add(ctx, ns, 'q', series_bound(got[12] or ''), now, d)
end

-- Unique tasks (core/unique.py): a record's field uq = '<s|e|w>:<ttl ms>:<digest>' names
-- its lock, the string key <tag>:uq:<digest> holding the id of the copy that holds it
-- (PX ttl: the window, or a backstop). With one shard the lock shares the record's hash
-- tag and is taken by the step that creates the record (spec.create.uq) or resubmits it;
-- with several (spec.uq_held) it lives in the global slot and was taken before the step
-- (uniq.lua). A lock held counts only while its holder's record exists and has not passed
-- the lock's point (until start: still waiting; end: not terminal; window: not cancelled).
local UQ_WAITING = {submitted = true, scheduled = true, unsubmitted = true}

local function uq_parse(v)
  return string.match(v or '', '^([sew]):(%d+):(%x+)$')
end

local function uq_key(task, hex)
  return string.match(task, '^{[^}]*}') .. ':uq:' .. hex
end

local function uq_record(task, id)
  return string.match(task, '^{[^}]*}') .. ':task:' .. id
end

-- the holder id if a live copy other than id holds the lock lk, else nil
local function uq_holder(task, lk, id)
  local holder = redis.call('GET', lk)
  if not holder or holder == id then return nil end
  local got = redis.call('HMGET', uq_record(task, holder), 'state', 'uq')
  local u = uq_parse(got[2])
  if not got[1] or not u then return nil end
  if u == 'w' then return got[1] ~= 'cancelled' and holder or nil end
  if TERMINAL[got[1]] then return nil end
  if u == 's' and not UQ_WAITING[got[1]] then return nil end
  return holder
end

-- take the lock named by uq for id; returns the live holder instead if another holds it
local function uq_take(task, uq, id)
  local u, ms, hex = uq_parse(uq)
  if not u then return nil end
  local lk = uq_key(task, hex)
  local holder = uq_holder(task, lk, id)
  if holder then return holder end
  redis.call('SET', lk, id, 'PX', tonumber(ms))
  return nil
end

-- whether the step to `to` is the point of the lock uq (where it is released)
local function uq_due(uq, to)
  local u = uq_parse(uq)
  return u and (TERMINAL[to] and u ~= 'w' or (u == 's' and to == 'started')
    or (u == 'w' and to == 'cancelled'))
end

-- release the lock of uq if it still names id and the step to `to` is its point
local function uq_release(task, uq, id, to)
  if not uq_due(uq, to) then return end
  local _, _, hex = uq_parse(uq)
  local lk = uq_key(task, hex)
  if redis.call('GET', lk) == id then redis.call('DEL', lk) end
end

-- ---- rate limits (rate_limit_by; see core/ratelimit.py, whose room_at is this arithmetic)
-- spec.rl of a start (one slot): {at, lim, name, d, g}: KEYS[at] the key's window (a sorted
-- set of its starts of the last period, scored by ms), KEYS[at+1] the overrides hash (task
-- name -> '10/s' or 'off'), KEYS[at+2] the key's waiting set (ids told to wait, scored by
-- run_at, kept g ms past it), KEYS[at+3] the name's held set (the same, per task name, for
-- the operators' counts). lim: the declared rate; d: the key's digest (its first 8 hex
-- digits in the history).
-- In the sharded layout rl.lua runs rate_wait and rate_take in the global slot before the
-- step, which is handed spec.rl = {wait, lim, d} (wait 0: admitted there).
local RATE_PERIOD = {s = 1000, m = 60000, h = 3600000, d = 86400000}

-- nil when the key has room now (rl.p is then the window's length, for rate_take), else
-- the wait in ms and the rate applied (rl.place: the caller's score in the waiting set).
-- core/ratelimit.py's turn_at and wait_place are this decision: a newcomer has every
-- waiting caller ahead of it, those past their run_at too (on their way back, kept rl.g ms:
-- the room is theirs); a caller back at or after its run_at starts whenever the window has
-- room, else (back early, or no room) has ahead those told to come back before it, and is
-- entered again before the next one (it keeps its place).
local function rate_wait(rl, keys, id, now)
  local lim = redis.call('HGET', keys[2], rl.name) or rl.lim
  if lim == 'off' then return nil end
  local n, u = string.match(lim, '^(%d+)/([smhd])$')
  if not n or tonumber(n) < 1 then  -- an override jobbers did not write: the declared rate
    lim = rl.lim
    n, u = string.match(lim, '^(%d+)/([smhd])$')
  end
  n = tonumber(n)
  local p = RATE_PERIOD[u]
  redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', now - p)
  redis.call('ZREMRANGEBYSCORE', keys[3], '-inf', now - (tonumber(rl.g) or 60000))
  local c = redis.call('ZCARD', keys[1])
  local mine = redis.call('ZSCORE', keys[3], id)
  local ahead
  if mine then
    redis.call('ZREM', keys[3], id)
    if tonumber(mine) <= now and c < n then
      rl.p = p
      return nil
    end
    ahead = redis.call('ZCOUNT', keys[3], '-inf', '(' .. mine)
  else
    ahead = redis.call('ZCARD', keys[3])
  end
  local j = c + ahead
  local top = math.max(c, n)
  if j < top then
    rl.p = p
    return nil
  end
  local k = math.floor((j - top) / n) + 1
  j = j - k * n
  local base = now
  if j < c then base = tonumber(redis.call('ZRANGE', keys[1], j, j, 'WITHSCORES')[2]) end
  local wait = math.max(1, base + k * p - now)
  rl.place = now + wait
  if mine then  -- before the next caller's score, and no earlier than its own
    local after = redis.call('ZRANGEBYSCORE', keys[3], '(' .. mine, '+inf', 'WITHSCORES',
                             'LIMIT', 0, 1)[2]
    if after then rl.place = math.min(rl.place, tonumber(after) - 1) end
    rl.place = math.max(tonumber(mine), rl.place)
  end
  return wait, lim
end

-- a start admitted: its entry in the key's window (member id:attempt, returned)
local function rate_take(rl, keys, id, attempt, now)
  local member = id .. ':' .. attempt
  redis.call('ZADD', keys[1], now, member)
  redis.call('PEXPIRE', keys[1], rl.p)
  return member
end

-- a start told to wait ms: its place in the key's waiting set (kept rl.g ms past its run_at,
-- pruned by rate_wait) and in the name's held set (counted until its run_at)
local function rate_defer(rl, keys, id, now, ms)
  local keep = ms + (tonumber(rl.g) or 60000) + 1000
  redis.call('ZADD', keys[3], rl.place or (now + ms), id)
  if redis.call('PTTL', keys[3]) < keep then redis.call('PEXPIRE', keys[3], keep) end
  redis.call('ZREMRANGEBYSCORE', keys[4], '-inf', now)
  redis.call('ZADD', keys[4], now + ms, id)
  if redis.call('PTTL', keys[4]) < ms + 1000 then redis.call('PEXPIRE', keys[4], ms + 1000) end
end

local function rate_reason(lim, d, ms)
  return 'rate limit ' .. lim .. ' for key ' .. d .. ' reached: waits '
    .. string.format('%.1f', ms / 1000) .. ' s, no retry used'
end

-- Fair shares (concurrency_key; core/fairshare.py, store/fairshare.py, store/keys.py fs:*):
-- at most cap running per (name, key digest). A key's started tasks (f.c) count only while
-- their lease in the name's set (ctx.conc, renewed and released as for max_concurrent) is
-- live, so an attempt that ended or whose worker died stops counting without a write of
-- its own (pruned here, O(cap)). Past the cap a task is parked: scheduled with run_at =
-- now + park_ms (a backstop only: the release pass, fair.lua, makes it due when its key
-- has room), entered in its key's first-in-first-out set f.p (scored by its place: see
-- fair_place). A key with parked tasks starts only the ones released (f.r, counted until
-- they start or their release expires), oldest first.

-- the key's started tasks whose lease is live (others pruned)
local function fair_running(conc, running, now)
  for _, id in ipairs(redis.call('ZRANGE', running, 0, -1)) do
    local until_ms = tonumber(redis.call('ZSCORE', conc, id) or '')
    if not until_ms or until_ms <= now then redis.call('ZREM', running, id) end
  end
  return redis.call('ZCARD', running)
end

-- is the key of task `id` at its cap (or are older tasks of it parked)?
local function fair_full(conc, f, id, cap, now)
  redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', f.r, '-inf', now)
  if redis.call('ZSCORE', f.c, id) then return false end
  local mine = redis.call('ZSCORE', f.r, id)
  local busy = fair_running(conc, f.c, now) + redis.call('ZCARD', f.r) - (mine and 1 or 0)
  if busy >= cap then return true end
  if mine then return false end
  -- parked ones go first, oldest first (ZRANGE: the documented ACL rule has no ZRANK)
  local first = redis.call('ZRANGE', f.p, 0, 0)[1]
  return first ~= nil and first ~= id
end

-- A key's sets vanish with their last entry; each write also sets them to expire after
-- f.ttl_ms (the retention) of silence, so that a key whose last task's worker died leaves
-- nothing behind for good.
local function fair_touch(f, key)
  redis.call('PEXPIRE', key, tonumber(f.ttl_ms) or 604800000)
end

-- park task `id` in its key's list (FIFO by `score`). One parked now goes after every task
-- parked before it, in the same millisecond too (a bulk publish parks a group's members in
-- one): the release order is the publish order, not the ids' order.
local function fair_park(f, id, cap, score, now)
  if score >= now and not redis.call('ZSCORE', f.p, id) then
    local last = tonumber(redis.call('ZRANGE', f.p, -1, -1, 'WITHSCORES')[2] or '')
    if last and last >= score then score = last + 0.001 end
  end
  redis.call('ZADD', f.p, 'NX', string.format('%.3f', score), id)
  fair_touch(f, f.p)
  redis.call('ZREM', f.r, id)
  redis.call('ZADD', f.i, 'NX', now, f.m)
  redis.call('HSET', f.caps, f.m, cap)
end

-- The place of a task parked at its start (every layout; the in-memory kit's _place too):
-- the place it had in its key's list when the release pass last took it out (the record's
-- field fp, written by store/fairshare.py's release), so that a task released and parked
-- again (its key full again by the time it started: its release expired, or its message
-- came back by its backstop) goes back ahead of the tasks parked after it, not behind
-- them; else, never parked, its first submission (sub_at); else now. One parked at its
-- publish is placed at now (its submission). A task still in the list keeps its score
-- (fair_park: NX). fair.lua's take (sharded) is given the record's two fields.
local function fair_place(fp, sub_at, now)
  return tonumber(fp or '') or tonumber(sub_at or '') or now
end

-- the history reason of a parked task
local function fair_reason(f, cap)
  return 'key ' .. f.d8 .. ' at max_concurrent=' .. cap .. ': parked, no retry used'
end

-- task `id` of the key starts: it counts as running, no longer as parked or released
local function fair_start(f, id, until_ms)
  redis.call('ZADD', f.c, until_ms, id)
  fair_touch(f, f.c)
  redis.call('ZREM', f.r, id)
  redis.call('ZREM', f.p, id)
end

-- ctx: {now, idx = {state -> index key}, all, publishing, stats, hbdue, wtasks, conc,
--       workers, name_idx}
local function step(ctx, task, spec)
  local now = ctx.now
  local ret = spec.ret or {}
  local got = redis.call('HMGET', task, 'state', 'attempt', 'start_at', 'cancel', 'wid', 'hn',
    'sub_at', 'worker', 'hb_iv', 'cap', 'name', 'queue', 'ql', 'retry_at', unpack(ret))
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
  -- spec.need: a field of spec.ret the caller cannot go on without (a resubmit's payload,
  -- which drop_payload.lua may have dropped since the caller looked): refused 'no_<field>',
  -- not counted as a refused transition (the caller takes it from elsewhere)
  if spec.need then
    for i, f in ipairs(ret) do
      if f == spec.need and not got[14 + i] then
        return {0, exists and cur or 'missing', now, attempt, 'no_' .. f}
      end
    end
  end
  -- a unique task's lock (see uq_take): taken by the publish that makes the record, and
  -- again by a resubmit (a terminal record back to submitted); a live other copy holding
  -- it refuses the step 'duplicate:<holder id>' (not counted as a refused transition)
  local uq = nil
  if not exists and spec.create then
    uq = spec.create.uq
  elseif TERMINAL[cur] and spec.to == 'submitted' then
    uq = redis.call('HGET', task, 'uq')
  end
  if uq and not spec.uq_held and not spec.split then
    local holder = uq_take(task, uq, spec.id)
    if holder then return {0, exists and cur or 'missing', now, attempt, 'duplicate:' .. holder} end
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
    elseif spec.fair then
      full = fair_full(ctx.conc, spec.fair, spec.id, tonumber(spec.cap), now)
    else
      redis.call('ZREMRANGEBYSCORE', ctx.conc, '-inf', now)  -- leases of dead holders
      full = not redis.call('ZSCORE', ctx.conc, spec.id)
        and redis.call('ZCARD', ctx.conc) >= tonumber(spec.cap)
    end
    if full then
      to, start, delay_ms = 'scheduled', false, spec.defer_ms
      reason = 'max_concurrent=' .. spec.cap .. ' reached: deferred, no retry used'
      if spec.fair then
        if spec.cap_held == nil then  -- sharded: parked in the global slot by fair.lua
          fair_park(spec.fair, spec.id, spec.cap,
            fair_place(redis.call('HGET', task, 'fp'), got[7], now), now)
        end
        delay_ms = spec.fair.park_ms
        reason = fair_reason(spec.fair, spec.cap)
      end
    end
  end
  if start and spec.rl then  -- rate_limit_by (see rate_wait)
    local wait, lim = spec.rl.wait, spec.rl.lim
    if not wait then
      local at = spec.rl.at
      spec.rl.keys = {KEYS[at], KEYS[at + 1], KEYS[at + 2], KEYS[at + 3]}
      wait, lim = rate_wait(spec.rl, spec.rl.keys, spec.id, now)
      if wait then rate_defer(spec.rl, spec.rl.keys, spec.id, now, wait) end
    end
    if wait and wait > 0 then
      to, start, delay_ms = 'scheduled', false, wait
      reason = rate_reason(lim, string.sub(spec.rl.d, 1, 8), wait)
    end
  end
  if spec.fair and to == 'cancelled' and spec.cap_held == nil then
    redis.call('ZREM', spec.fair.r, spec.id)  -- no longer on its way to start
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
  elseif spec.create and cur == 'unsubmitted' and redis.call('HGET', task, 'rpl') then
    -- the publish of the task Celery's replace() gave this id (the replace step marked the
    -- record rpl): the record becomes that task's (name, queue, version, dead-letter flag,
    -- retries; listed under its name: the old name's index entry is filtered out of
    -- listings, tidied lazily). Any other publish to an existing record keeps its fields.
    for k, v in pairs(spec.create) do
      if k ~= 'attempt' then w[#w + 1] = k; w[#w + 1] = v end
    end
    for _, f in ipairs({'ver', 'dlq'}) do
      if spec.create[f] == nil then d[#d + 1] = f end
    end
    if not (spec.set and spec.set.retries) then d[#d + 1] = 'retries' end
    d[#d + 1] = 'rpl'
    if ctx.name_idx and spec.create.name ~= redis.call('HGET', task, 'name') then
      redis.call('ZADD', ctx.name_idx, now, spec.id)
    end
  end
  if spec.bump and not start then
    attempt = attempt + 1
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
  end
  if start then
    attempt = attempt + 1
    w[#w + 1] = 'attempt'; w[#w + 1] = attempt
    w[#w + 1] = 'hb_at'; w[#w + 1] = now
    -- how long this attempt's message waited (since the task entered submitted), counted
    -- in the history when the attempt ends (series_step); none for a take-back
    local entered = cur == 'submitted'
      and tonumber(redis.call('ZSCORE', ctx.idx[cur], spec.id) or '')
    w[#w + 1] = 'ql'; w[#w + 1] = entered and math.max(0, now - entered) or 0
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
        if spec.fair then
          fair_start(spec.fair, spec.id, now + tonumber(spec.lease_cap_ms))
        end
      end
      w[#w + 1] = 'cap'; w[#w + 1] = spec.cap
    end
    if spec.set then
      for k, v in pairs(spec.set) do w[#w + 1] = k; w[#w + 1] = v end
    end
    if spec.rl and spec.rl.p then rate_take(spec.rl, spec.rl.keys, spec.id, attempt, now) end
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
  if terminal or to == 'started' then
    uq = uq or (exists and redis.call('HGET', task, 'uq')) or (spec.create and spec.create.uq)
    if uq and spec.split then  -- sharded: the lock is in the global slot, its caller frees it
      if uq_due(uq, to) then ctx.uq_freed = uq end
    elseif uq then
      uq_release(task, uq, spec.id, to)
    end
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

  if exists then series_step(ctx, task, cur, to, got, attempt, now) end
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
    for i = 1, #ret do after[ret[i]] = got[14 + i] or '' end
    for i = 1, #w, 2 do if after[w[i]] then after[w[i]] = w[i + 1] end end
    for _, f in ipairs(d) do if after[f] then after[f] = '' end end
    for i = 1, #ret do out[#out + 1] = after[ret[i]] end
  end
  if spec.split then
    -- with a unique lock to free too: {lease name or '', the record's uq}
    out[#out + 1] = ctx.uq_freed and {ctx.freed or '', ctx.uq_freed} or (ctx.freed or '')
    ctx.freed, ctx.uq_freed = nil, nil
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
