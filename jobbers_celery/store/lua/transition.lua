-- transition.lua: one lifecycle step for one task (see _lib.lua for the spec).
-- KEYS: shared layout, then task hash, history list, and, for a step that may create the
-- record, the name and queue indexes and the epoch key.
-- ARGV[1] states order, ARGV[2] JSON spec.
-- Returns what step() returns; a step that may create the record and applied also returns
-- the dataset's epoch id last (made here if there is none yet).
local ctx, k = context()
ctx.name_idx = KEYS[k + 2]
ctx.queue_idx = KEYS[k + 3]
local spec = cjson.decode(ARGV[2])
local out = step(ctx, KEYS[k], KEYS[k + 1], spec)
if spec.create and out[1] == 1 then
  local epoch = redis.call('GET', KEYS[k + 4])
  if not epoch then
    epoch = ctx.now .. '-' .. spec.id
    redis.call('SET', KEYS[k + 4], epoch)
  end
  out[#out + 1] = epoch
end
return out
