-- uniq.lua: a unique task's lock in the global slot, in the sharded layout, where the
-- record lives in its shard's (see _lib.lua, uq_*): taken here before the step that makes
-- the record or resubmits it (told spec.uq_held), released here when that step is refused
-- or when a step reaches the lock's point (its caller frees what the step returned). A
-- lock naming a copy whose record is gone or past the lock's point counts as free: the
-- caller reads the holder's record (another slot) and takes the lock over with 'swap'.
-- KEYS[1] the lock
-- ARGV[1] 'take', 'swap', 'renew' or 'free'; ARGV[2] the task id; take, swap and renew:
-- ARGV[3] the expiry ms; swap: ARGV[4] the holder found gone
-- 'renew' follows a resubmit (a stall recovery too) that applied while its task held the
-- lock already: the lock gets its expiry again (one that lapsed meanwhile is taken again,
-- never one another copy took), as _lib.lua's uq_take sets it on one shard. The take
-- before the step leaves the expiry alone: a refused resubmit must not renew it.
-- Returns take and swap: {'', 0} when the task took the lock now, {'', 1} when it held it
-- already (an earlier publish of the same id: a refused step must not give it back), else
-- {the id holding it, the lock's PTTL} (how long ago it was taken: a holder whose record
-- does not exist yet may be between this take and its step); free and renew: ''.
local op, id = ARGV[1], ARGV[2]
local holder = redis.call('GET', KEYS[1])
if op == 'free' then
  if holder == id then redis.call('DEL', KEYS[1]) end
  return ''
end
if op == 'renew' then
  if not holder or holder == id then redis.call('SET', KEYS[1], id, 'PX', tonumber(ARGV[3])) end
  return ''
end
if holder == id then return {'', 1} end
if holder and not (op == 'swap' and holder == ARGV[4]) then
  return {holder, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], id, 'PX', tonumber(ARGV[3]))
return {'', 0}
