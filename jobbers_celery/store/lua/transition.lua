-- transition.lua: one lifecycle step for one task (see _lib.lua for the spec).
-- KEYS: shared layout, then task hash and, for a step that may create the record, the name
-- index and the epoch key; for a take-back (spec.giver) last the shard's clock hash and the
-- giver's not-running hash.
-- ARGV[1] states order, ARGV[2] JSON spec.
-- spec.later {delay_ms, reason}: once the step to submitted applied, a second one to
-- scheduled (run_at = now + delay_ms) in the same script: a first publish with a countdown
-- or an eta waits in the store, never half-recorded (two history entries).
-- Returns what step() returns (with the state after the second step, if any); a step that
-- may create the record and applied also returns the dataset's epoch id last (made here if
-- there is none yet).
local ctx, k = context()
ctx.name_idx = KEYS[k + 1]
local spec = cjson.decode(ARGV[2])
if spec.giver then ctx.clock, ctx.notrun = KEYS[#KEYS - 1], KEYS[#KEYS] end
local out = step(ctx, KEYS[k], spec)
if spec.later and out[1] == 1 and out[5] == 'submitted' then
  local later = step(ctx, KEYS[k], {id = spec.id, to = 'scheduled', from = {'submitted'},
    delay_ms = spec.later.delay_ms, reason = spec.later.reason, ttl = spec.ttl})
  if later[1] == 1 then out[5] = later[5] end
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
