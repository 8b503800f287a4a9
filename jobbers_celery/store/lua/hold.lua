-- hold.lua: hold a message whose task name is paused (see store/pauses.py): its record
-- goes submitted -> scheduled (spec: a step to scheduled, delay_ms far ahead, reason
-- "paused: ..."), with no run_at, and enters the name's held set; only while the shard's
-- copy of the pauses names it, read in this script: a resume that removed it first finds
-- nothing to release, and this hold is refused ('not_paused'): the worker runs the task.
-- KEYS: shared layout, then the task hash, the shard's pauses hash, the name's held set.
-- ARGV[1] states order, ARGV[2] JSON spec, ARGV[3] the pause field (task:<name>).
-- Returns what step() returns, or {0, state, now, 0, 'not_paused'}.
local ctx, k = context()
local spec = cjson.decode(ARGV[2])
if not redis.call('HGET', KEYS[k + 1], ARGV[3]) then  -- hget, not hexists: the ACL rule's
  return {0, redis.call('HGET', KEYS[k], 'state') or 'missing', ctx.now, 0, 'not_paused'}
end
local out = step(ctx, KEYS[k], spec)
if out[1] == 1 and out[5] == 'scheduled' then
  redis.call('HDEL', KEYS[k], 'run_at')
  redis.call('ZADD', KEYS[k + 2], ctx.now, spec.id)
end
return out
