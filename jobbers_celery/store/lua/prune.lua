-- prune.lua: forget terminal records older than the retention period (their history is in
-- the record) and their index entries. Compare-and-set: a record resubmitted meanwhile is left alone.
-- KEYS: shared layout, then (task hash, name index) per id
-- ARGV[1] states order, ARGV[2] JSON {ids, cutoff_ms, terminal}
-- Returns the number of records removed.
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local terminal = {}
for _, s in ipairs(req.terminal) do terminal[s] = true end
local removed = 0
for i, id in ipairs(req.ids) do
  local base = k + 2 * (i - 1)
  local task, name_idx = KEYS[base], KEYS[base + 1]
  local state = redis.call('HGET', task, 'state')
  local done = tonumber(redis.call('HGET', task, 'done_at') or '')
  if state == false or (terminal[state] and done and done <= tonumber(req.cutoff_ms)) then
    for s, key in pairs(ctx.idx) do
      if terminal[s] then redis.call('ZREM', key, id) end
    end
    redis.call('ZREM', ctx.all, id)
    redis.call('ZREM', name_idx, id)
    redis.call('DEL', task)
    removed = removed + 1
  end
end
return removed
