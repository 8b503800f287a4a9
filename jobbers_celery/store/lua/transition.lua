-- transition.lua: one lifecycle step for one task (see _lib.lua for the spec).
-- KEYS: shared layout, then task hash and, for a step that may create the record, the name
-- index and the epoch key, then for a canvas member (spec.wf) its workflow's index, cancel
-- mark and spec.wf.aliases alias keys, then a publish's argument-index keys (spec.ix); for
-- a take-back (spec.giver) last
-- the shard's clock hash and the giver's not-running hash.
-- ARGV[1] states order, ARGV[2] JSON spec, ARGV[3] (optional) the payload to set as the
-- field msg, apart from the spec so that it is stored as it is, never decoded here.
-- spec.later {delay_ms, reason}: once the step to submitted applied, a second one to
-- scheduled (run_at = now + delay_ms) in the same script: a first publish with a countdown
-- or an eta waits in the store, never half-recorded (two history entries).
-- spec.fairpub: a publish under fair shares (_lib.lua's fair section; one shard): once
-- submitted, parked (a second step to scheduled, as spec.later) when its key has no room,
-- else counted as on its way to start, and its message is sent by the caller.
-- spec.wf {key, aliases, reason}: a canvas member's publish (see core/workflow.py) enters
-- it in its workflow's index (NX: its first submission time stays), maps the ids that name
-- the workflow besides its members' to its key (a nested group, a chord callback, a chain's
-- last link) and, while the workflow's cancel mark is set, cancels a record it
-- created at once (submitted or scheduled -> cancelled, reason spec.wf.reason): a member
-- published after its workflow was cancelled never runs.
-- spec.ix {at, n, cap}: the publish's indexed argument values (see core/search.py): the
-- n keys from KEYS[at] (one sorted set per path and value) get the id (NX: its first
-- submission time stays), each trimmed to its newest cap ids.
-- Returns what step() returns (with the state after the second step, if any); a step that
-- may create the record and applied also returns the dataset's epoch id last (made here if
-- there is none yet).
local ctx, k = context()
ctx.name_idx = KEYS[k + 1]
local spec = cjson.decode(ARGV[2])
if ARGV[3] then
  spec.set = spec.set or {}
  spec.set.msg = ARGV[3]
end
if spec.giver then ctx.clock, ctx.notrun = KEYS[#KEYS - 1], KEYS[#KEYS] end
local out = step(ctx, KEYS[k], spec)
if spec.fairpub and out[1] == 1 and out[5] == 'submitted' then
  -- a fair-share publish (one shard): past its key's room it is parked, no message sent
  local f = spec.fairpub
  if fair_full(f.conc, f, spec.id, tonumber(f.cap), ctx.now) then
    fair_park(f, spec.id, f.cap, ctx.now, ctx.now)
    spec.later = {delay_ms = f.park_ms, reason = fair_reason(f, f.cap)}
  else
    redis.call('ZADD', f.r, ctx.now + tonumber(f.way_ms), spec.id)  -- on its way to start
    redis.call('ZREM', f.p, spec.id)  -- the head of the parked ones published (came due)
  end
end
if spec.later and out[1] == 1 and out[5] == 'submitted' then
  local later = step(ctx, KEYS[k], {id = spec.id, to = 'scheduled', from = {'submitted'},
    delay_ms = spec.later.delay_ms, reason = spec.later.reason, ttl = spec.ttl})
  if later[1] == 1 then out[5] = later[5] end
end
if spec.wf and out[1] == 1 then
  redis.call('ZADD', KEYS[k + 3], 'NX', ctx.now, spec.id)
  for i = 1, spec.wf.aliases do
    -- the first workflow to name an id keeps it: a later message naming it for another
    -- workflow (a crafted header) cannot take over what that id's reads and actions reach
    if not redis.call('SET', KEYS[k + 4 + i], spec.wf.key, 'NX', 'EX', spec.ttl) then
      if redis.call('GET', KEYS[k + 4 + i]) == spec.wf.key then
        redis.call('EXPIRE', KEYS[k + 4 + i], spec.ttl)
      end
    end
  end
  if out[2] == 'missing' and (out[5] == 'submitted' or out[5] == 'scheduled')
      and redis.call('EXISTS', KEYS[k + 4]) == 1 then
    local x = step(ctx, KEYS[k], {id = spec.id, to = 'cancelled', from = {out[5]},
      reason = spec.wf.reason, ttl = spec.ttl, split = spec.split})
    if x[1] == 1 then
      out[5] = x[5]
      if spec.fairpub then  -- a group's member under fair shares: neither on its way nor parked
        redis.call('ZREM', spec.fairpub.r, spec.id)
        redis.call('ZREM', spec.fairpub.p, spec.id)
      end
      -- split: a unique member's lock, for the caller to free (the publish freed nothing)
      if spec.split and x[6] ~= '' then out[6 + #(spec.ret or {})] = x[6] end
    end
  end
end
if spec.ix and out[1] == 1 then
  for i = spec.ix.at, spec.ix.at + spec.ix.n - 1 do
    redis.call('ZADD', KEYS[i], 'NX', ctx.now, spec.id)
    if redis.call('ZCARD', KEYS[i]) > spec.ix.cap then
      redis.call('ZREMRANGEBYRANK', KEYS[i], 0, -spec.ix.cap - 1)
    end
  end
end
if spec.create and out[1] == 1 then
  local epoch = redis.call('GET', KEYS[k + 2])
  if not epoch then
    epoch = ctx.now .. '-' .. spec.id
    redis.call('SET', KEYS[k + 2], epoch)
  end
  out[#out + 1] = epoch
end
return out
