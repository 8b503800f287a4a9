-- prune.lua: forget terminal records older than the retention period (their history is in
-- the record) and their index entries (a canvas member's workflow index, the argument
-- indexes its field ix names, too).
-- Compare-and-set: a record resubmitted meanwhile is left alone.
-- KEYS: shared layout, then (task hash, name index, workflow index or the name index again,
-- then ix[i] argument-index keys) per id
-- ARGV[1] states order, ARGV[2] JSON {ids, cutoff_ms, terminal, ix (optional: per id, how
-- many argument-index keys follow its three)}
-- Returns the number of records removed.
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local terminal = {}
for _, s in ipairs(req.terminal) do terminal[s] = true end
local removed = 0
local base = k
for i, id in ipairs(req.ids) do
  local task, name_idx, wf_idx = KEYS[base], KEYS[base + 1], KEYS[base + 2]
  local nix = req.ix and req.ix[i] or 0
  local state = redis.call('HGET', task, 'state')
  local done = tonumber(redis.call('HGET', task, 'done_at') or '')
  if state == false or (terminal[state] and done and done <= tonumber(req.cutoff_ms)) then
    for s, key in pairs(ctx.idx) do
      if terminal[s] then redis.call('ZREM', key, id) end
    end
    redis.call('ZREM', ctx.all, id)
    redis.call('ZREM', name_idx, id)
    redis.call('ZREM', wf_idx, id)
    for j = 1, nix do redis.call('ZREM', KEYS[base + 2 + j], id) end
    redis.call('DEL', task)
    removed = removed + 1
  end
  base = base + 3 + nix
end
return removed
