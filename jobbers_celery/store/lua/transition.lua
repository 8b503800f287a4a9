-- transition.lua: one lifecycle step for one task (see _lib.lua for the spec).
-- KEYS: shared layout, then task hash and, for a step that may create the record, the name
-- index and the epoch key.
-- ARGV[1] states order, ARGV[2] JSON spec.
-- Returns what step() returns; a step that may create the record and applied also returns
-- the dataset's epoch id last (made here if there is none yet).
local ctx, k = context()
ctx.name_idx = KEYS[k + 1]
local spec = cjson.decode(ARGV[2])
local out = step(ctx, KEYS[k], spec)
if spec.create and out[1] == 1 then
  local epoch = redis.call('GET', KEYS[k + 2])
  if not epoch then
    epoch = ctx.now .. '-' .. spec.id
    redis.call('SET', KEYS[k + 2], epoch)
  end
  out[#out + 1] = epoch
end
return out
