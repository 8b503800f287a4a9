-- cancel.lua: durable cancellation. A submitted or scheduled task becomes cancelled at once
-- (its message, when delivered, finds the record cancelled and is dropped); a started task
-- (or one between an immediate retry and its republish) is flagged: it ends cancelled at its
-- next heartbeat or lifecycle step, and with terminate_ms its worker interrupts it then.
-- KEYS: shared layout (states submitted, scheduled, started, cancelled), then task hash,
-- cancelling set.
-- ARGV[1] states order, ARGV[2] JSON {id, ttl, reason, terminate_ms?, set?, keep?, split?}
-- keep: a started task's reason is kept (field cxl) for the step that ends it cancelled,
-- unless a cancellation was already requested (the first request's reason stands).
-- split: the sharded layout (see _lib.lua's step): a unique task's lock, in the global slot,
-- is returned for the caller to free.
-- Returns {"cancelled"|"requested"|"no", state before ("missing")}, and after "cancelled"
-- in the sharded layout what the step freed (its r[6]: '' or {'', the record's uq})
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local task, cancelling = KEYS[k], KEYS[k + 1]
local state = redis.call('HGET', task, 'state')
if state == 'submitted' or state == 'scheduled' then
  local r = step(ctx, task, {id = req.id, to = 'cancelled',
    from = {'scheduled', 'submitted'}, ttl = req.ttl, reason = req.reason, set = req.set,
    split = req.split})
  if r[1] == 1 then return {'cancelled', state, req.split and r[6] or ''} end
elseif state == 'started' or state == 'unsubmitted' then
  if req.keep and not redis.call('HGET', task, 'cancel') then  -- HGET: no HEXISTS in the ACL rule
    redis.call('HSET', task, 'cxl', req.reason)
  end
  redis.call('HSET', task, 'cancel', ctx.now)
  if state == 'started' and req.terminate_ms then
    redis.call('ZADD', cancelling, ctx.now + tonumber(req.terminate_ms), req.id)
  end
  return {'requested', state}
end
return {'no', state or 'missing'}
