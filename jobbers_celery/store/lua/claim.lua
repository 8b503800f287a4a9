-- claim.lua: atomically claim due scheduled tasks (scheduled -> submitted, with a publish
-- lease) and publishes whose lease expired, so that concurrent schedulers never both get one.
-- An expired lease on an unsubmitted record is an immediate retry or a shutdown resubmit
-- whose publisher died between its step and its publish: it is submitted and published here.
-- KEYS: shared layout, then the task hash of each id in ARGV[2].ids
-- ARGV[1] states order, ARGV[2] JSON {ids, lease_ms, worker, from, released}
-- released: ids of parked tasks the fair shares' release pass let go (fair.lua): claimed
-- whatever their run_at (a parked task's is a backstop).
-- Returns a flat list of {id, msg, retries, name, run_at, queue} for every id this caller
-- must publish; run_at is '' unless the task was claimed because its run_at came.
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local released = {}
for _, id in ipairs(req.released or {}) do released[id] = true end
local out = {}
for i, id in ipairs(req.ids) do
  local task = KEYS[k + i - 1]
  local state = redis.call('HGET', task, 'state')
  local run_at = tonumber(redis.call('HGET', task, 'run_at') or '')
  if state == 'scheduled' and (released[id] or (run_at and run_at <= ctx.now)) then
    local let_go = released[id] and not (run_at and run_at <= ctx.now)
    local r = step(ctx, task, {id = id, to = 'submitted', from = req.from,
      lease_ms = req.lease_ms, worker = req.worker,
      reason = let_go and 'released: its key has room (fair share)' or 'run_at reached',
      ret = {'msg', 'retries', 'name', 'queue'}})
    if r[1] == 1 then
      out[#out + 1] = id; out[#out + 1] = r[6]; out[#out + 1] = r[7]; out[#out + 1] = r[8]
      out[#out + 1] = let_go and '' or run_at; out[#out + 1] = r[9]
    end
  else
    local deadline = tonumber(redis.call('ZSCORE', ctx.publishing, id) or '')
    if deadline and deadline <= ctx.now then
      if state == 'submitted' then
        -- the claimer died or hung before confirming: publish again (start dedupes)
        redis.call('ZADD', ctx.publishing, ctx.now + tonumber(req.lease_ms), id)
        redis.call('HINCRBY', ctx.stats, 'republished', 1)
        out[#out + 1] = id
        out[#out + 1] = redis.call('HGET', task, 'msg') or ''
        out[#out + 1] = redis.call('HGET', task, 'retries') or '0'
        out[#out + 1] = redis.call('HGET', task, 'name') or ''
        out[#out + 1] = ''
        out[#out + 1] = redis.call('HGET', task, 'queue') or ''
      elseif state == 'unsubmitted' then
        local r = step(ctx, task, {id = id, to = 'submitted', from = {'unsubmitted'},
          lease_ms = req.lease_ms, worker = req.worker,
          reason = 'published by a scheduler: its publisher did not',
          ret = {'msg', 'retries', 'name', 'queue'}})
        if r[1] == 1 then
          out[#out + 1] = id; out[#out + 1] = r[6]; out[#out + 1] = r[7]; out[#out + 1] = r[8]
          out[#out + 1] = ''; out[#out + 1] = r[9]
        end
      else
        redis.call('ZREM', ctx.publishing, id)
      end
    end
  end
end
return out
