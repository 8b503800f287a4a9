-- stall.lua: the cleaner's verdicts. For each candidate the evidence is re-read here, so the
-- verdict and the step are one compare-and-set: the task must still be started under the
-- same attempt (the fence) and still be silent, by the Redis clock.
--   kind "hb":     no heartbeat for longer than its max_heartbeat_interval (hb_iv)
--   kind "worker": its worker incarnation has not been seen for lost_ms
--   kind "gone":   its worker, alive, says it does not run it (alive.lua's orphans)
-- Silence is counted from resumed_at when that is later (after a Redis outage, pause,
-- restart or failover nobody could report); a heartbeat silence also leaves out the clock's
-- last quiet window (a shorter silence of everyone, _lib.lua's tick). A stalled task is
-- resubmitted at once (stalled -> submitted, same id, publish lease) while it has stall
-- recoveries left; otherwise it is returned for the dead-letter queue. Dead incarnations
-- left without tasks are forgotten.
-- A verdict on an attempt its worker may still run (kinds "hb" and "worker": frozen, or cut
-- off from Redis) also enters it in that incarnation's halt hash (id -> "<now>|<attempt>"):
-- the worker, alive, ends the attempt at its next liveness refresh (alive.lua), freeing
-- its pool slot.
-- KEYS: shared layout (states started, stalled, submitted), clock hash, a spare key, then
-- per item (task hash, worker-tasks set, concurrency-lease set, halt hash of its
-- incarnation), then one worker-tasks set per incarnation in req.forget, then their halt
-- hashes, in the same order.
-- A unique task's recovery takes its lock again (_lib.lua's step, in the same script). In
-- the sharded layout its lock is in the global slot, out of this script's reach: such a
-- task, judged stalled with a recovery left, is left as it is (started) and returned in
-- `again`; the caller takes the lock (uniq.lua) and calls again with each such item's
-- `lock`: 'held' (the recovery step runs, told the lock is held) or 'duplicate:<id>'
-- (another copy holds it: the recovery is refused). The verdict and the recovery are thus
-- one script, as on one Redis: a caller that dies or fails before its second call leaves
-- the task started, judged again on a later pass. A recovery refused leaves the task
-- stalled and returns it with the dead, its reason saying why.
-- ARGV[1] states order, ARGV[2] JSON {items = {{id, kind, wid, lock?}}, lost_ms, lease_ms,
-- ttl, forget = {wid...}, split?} (split: the sharded layout, see _lib.lua's step)
-- Returns JSON {recovered = {{id, msg, retries, name, queue, now, started}}, dead = {{id,
-- attempt, now, reason, started, fields...}}, stalled = n, kept = n, freed = {{id, name}},
-- unlock = {{id, uq}}, again = {{the fields of both, uq, stalls}}}; started is when the
-- stalled attempt started (ms); freed: the concurrency leases the caller releases, unlock:
-- the unique locks it frees (the dead's), again: see above (split only; stalls: the
-- record's count once recovered).
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local clock, workers = KEYS[k], ctx.workers
local now = ctx.now
new_server(clock, now)  -- failed over since the pass looked: the grace starts now
local resumed = tonumber(redis.call('HGET', clock, 'resumed_at') or '0') or 0
-- the last quiet window (_lib.lua's tick): a heartbeat silence within it is not counted
local quiet = redis.call('HMGET', clock, 'quiet_from', 'quiet_to')
local quiet_from, quiet_to = tonumber(quiet[1] or '') or 0, tonumber(quiet[2] or '') or 0
local lost_ms = tonumber(req.lost_ms)
local recovered, dead, stalled, kept, freed, unlock, again = {}, {}, 0, 0, {}, {}, {}
local FIELDS = {'state', 'attempt', 'hb_at', 'hb_iv', 'wid', 'srec', 'stalls', 'worker',
                'msg', 'ver', 'queue', 'retries', 'ckpt', 'dlq', 'name', 'start_at', 'retry_at',
                'uq'}

local function secs(ms) return string.format('%.1fs', ms / 1000) end

for i, item in ipairs(req.items) do
  local base = k + 2 + 4 * (i - 1)
  local task = KEYS[base]
  ctx.wtasks, ctx.conc = KEYS[base + 1], KEYS[base + 2]
  local halts = KEYS[base + 3]
  local v = redis.call('HMGET', task, unpack(FIELDS))
  local f = {}
  for j, name in ipairs(FIELDS) do f[name] = v[j] end
  local reason = nil
  if f.state ~= 'started' then
    -- finished meanwhile: tidy the index entry that pointed here
    if item.kind == 'hb' then redis.call('ZREM', ctx.hbdue, item.id) end
    if item.kind == 'worker' then redis.call('ZREM', ctx.wtasks, item.id) end
  elseif f.wid ~= item.wid then
    -- started again elsewhere since the cleaner looked: judge it on a later pass
    if item.kind == 'worker' then redis.call('ZREM', ctx.wtasks, item.id) end
    kept = kept + 1
  elseif item.kind == 'hb' then
    local iv = tonumber(f.hb_iv or '')
    local hb = tonumber(f.hb_at or '0') or 0
    if not iv then
      redis.call('ZREM', ctx.hbdue, item.id)
    else
      local from = math.max(hb, resumed)
      local silent = now - from
      if quiet_to > from then
        silent = silent - (quiet_to - math.max(quiet_from, from))
      end
      if silent > iv then
        reason = 'stalled: no heartbeat for ' .. secs(now - hb) .. ' (max_heartbeat_interval '
          .. secs(iv) .. '); last heartbeat ' .. iso(hb) .. '; worker ' .. (f.worker or '?')
      else
        -- refreshed, in grace, or silent while Redis was quiet
        redis.call('ZADD', ctx.hbdue, now + iv - silent, item.id)
        kept = kept + 1
      end
    end
  elseif item.kind == 'gone' then
    -- its worker, alive, does not run it (alive.lua): the step that ended it was lost
    reason = 'stalled: worker ' .. (f.worker or '?') .. ' (' .. item.wid .. ') no longer '
      .. 'runs it and its end was not recorded (lost by a Redis failover or restart); '
      .. 'last heartbeat ' .. iso(f.hb_at)
  else
    local seen = tonumber(redis.call('ZSCORE', workers, item.wid) or '')
    local from = math.max(seen or 0, resumed)
    if now - from > lost_ms then
      reason = 'stalled: worker ' .. (f.worker or '?') .. ' (' .. item.wid .. ') not seen '
        .. (seen and ('for ' .. secs(now - seen) .. ', since ' .. iso(seen)) or 'at all')
        .. ' (jobbers_worker_lost_after ' .. secs(lost_ms) .. '); last heartbeat '
        .. iso(f.hb_at)
    else
      kept = kept + 1
    end
  end
  if reason then
    local attempt = tonumber(f.attempt or '0') or 0
    local started = f.retry_at or f.start_at or ''
    local done = tonumber(f.stalls or '0') or 0
    local allowed = tonumber(f.srec or '0') or 0
    local info = {id = item.id, attempt = attempt, now = now, reason = reason,
      msg = f.msg or '', ver = f.ver or '', queue = f.queue or '',
      retries = f.retries or '0', ckpt = f.ckpt or '', dlq = f.dlq or '',
      name = f.name or '', worker = f.worker or '', started = started}
    if req.split and f.uq and done < allowed and not item.lock then
      info.uq, info.stalls = f.uq, tostring(done + 1)  -- its lock first (see above)
      again[#again + 1] = info
    else
      local r = step(ctx, task, {id = item.id, to = 'stalled', from = {'started'},
        fence = attempt, ttl = req.ttl, reason = reason, worker = f.worker, split = req.split,
        set = {err = cjson.encode({type = 'Stalled', message = reason}),
               -- the store's own mark that this attempt never ran there (a take-back's proof)
               gone = item.kind == 'gone' and tostring(attempt) or nil}})
      if r[1] == 1 then
        stalled = stalled + 1
        -- split: r[6] names the lease to release, or is {that name, the lock to free}
        local lease, lock = r[6], nil
        if type(lease) == 'table' then lease, lock = lease[1], lease[2] end
        if req.split and lease ~= '' then freed[#freed + 1] = {item.id, lease} end
        if item.kind ~= 'gone' then
          redis.call('HSET', halts, item.id, now .. '|' .. attempt)
        end
        local refused = nil
        if done < allowed then
          if item.lock and item.lock ~= 'held' then
            refused = item.lock  -- sharded: another copy holds the lock
          else
            local back = step(ctx, task, {id = item.id, to = 'submitted', from = {'stalled'},
              lease_ms = req.lease_ms, set = {stalls = tostring(done + 1)},
              reason = 'stall recovery ' .. (done + 1) .. ' of ' .. allowed,
              uq_held = item.lock == 'held' or nil})
            if back[1] == 1 then
              recovered[#recovered + 1] = {id = item.id, msg = f.msg or '',
                retries = f.retries or '0', name = f.name or '', queue = f.queue or '',
                now = now, started = started}
            else
              refused = back[5]
            end
          end
        end
        if done >= allowed or refused then
          if refused then info.reason = reason .. '; not resubmitted: ' .. refused end
          dead[#dead + 1] = info
          -- an until=end lock (until=start: freed at the start already)
          if req.split and lock and string.sub(lock, 1, 1) == 'e' then
            unlock[#unlock + 1] = {item.id, lock}
          end
        end
      end
    end
  end
end

local base = k + 2 + 4 * #req.items
for i, wid in ipairs(req.forget) do
  local seen = tonumber(redis.call('ZSCORE', workers, wid) or '')
  if redis.call('ZCARD', KEYS[base + i - 1]) == 0 and (not seen or now - seen > lost_ms) then
    redis.call('ZREM', workers, wid)
    redis.call('DEL', KEYS[base + #req.forget + i - 1])
  end
end

return cjson.encode({recovered = recovered, dead = dead, stalled = stalled, kept = kept,
  freed = freed, unlock = unlock, again = again})
