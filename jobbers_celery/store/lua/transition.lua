-- transition.lua: one lifecycle step for one task (see _lib.lua for the spec).
-- KEYS: shared layout, then task hash, history list, and (optional) name and queue indexes.
-- ARGV[1] states order, ARGV[2] JSON spec.
-- Returns {applied 0|1, state before ("missing" if none), now_ms, attempt, ret... | why}
local ctx, k = context()
ctx.name_idx = KEYS[k + 2]
ctx.queue_idx = KEYS[k + 3]
return step(ctx, KEYS[k], KEYS[k + 1], cjson.decode(ARGV[2]))
