-- release.lua: the resume of a task name, in one shard: each held task of the name
-- (scheduled without run_at) goes scheduled -> submitted with a publish lease, as
-- claim.lua claims a due one, for the caller to publish; every id leaves the held set
-- (a held task cancelled meanwhile is only forgotten). Nothing is released while the
-- name is paused again (the shard's copy of the pauses names it).
-- KEYS: shared layout, then the task hash of each id in ARGV[2].ids, then the shard's
-- pauses hash and the name's held set.
-- ARGV[1] states order, ARGV[2] JSON {ids, lease_ms, worker, reason, field}
-- Returns {'paused'}, or {'ok', id, msg, retries, name, queue, ...} for each released id.
local ctx, k = context()
local req = cjson.decode(ARGV[2])
local pauses, held = KEYS[#KEYS - 1], KEYS[#KEYS]
if redis.call('HGET', pauses, req.field) then return {'paused'} end  -- hget, not hexists: the ACL rule's
local out = {'ok'}
for i, id in ipairs(req.ids) do
  local task = KEYS[k + i - 1]
  local got = redis.call('HMGET', task, 'state', 'run_at')
  if got[1] == 'scheduled' and not got[2] then
    local r = step(ctx, task, {id = id, to = 'submitted', from = {'scheduled'},
      lease_ms = req.lease_ms, worker = req.worker, reason = req.reason,
      ret = {'msg', 'retries', 'name', 'queue'}})
    if r[1] == 1 then
      out[#out + 1] = id; out[#out + 1] = r[6]; out[#out + 1] = r[7]
      out[#out + 1] = r[8]; out[#out + 1] = r[9]
    end
  end
  redis.call('ZREM', held, id)
end
return out
