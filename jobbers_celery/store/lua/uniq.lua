-- uniq.lua: a unique task's lock in the global slot, in the sharded layout, where the
-- record lives in its shard's (see _lib.lua, uq_*): taken here before the step that makes
-- the record or resubmits it (told spec.uq_held), released here when that step is refused
-- or when a step reaches the lock's point (its caller frees what the step returned). A
-- lock naming a copy whose record is gone or past the lock's point counts as free: the
-- caller reads the holder's record (another slot) and takes the lock over with 'swap'.
-- KEYS[1] the lock
-- ARGV[1] 'take', 'swap', 'renew' or 'free'; ARGV[2] the task id; take, swap and renew:
-- ARGV[3] the expiry ms; swap: ARGV[4] the holder found gone; renew: ARGV[4] '1' when no
-- delete of the lock can be in flight (the cleaner's recovery of a copy still started,
-- none of whose steps reached the lock's point)
-- 'renew' follows a resubmit (a stall recovery too) that applied while its task held the
-- lock already: the lock gets its expiry again (one that lapsed meanwhile is taken again,
-- never one another copy took), as _lib.lua's uq_take sets it on one shard. The take
-- before the step leaves the expiry alone: a refused resubmit must not renew it.
-- The delete that follows a step reaching the lock's point is a call of its own, and
-- compares the id only: a copy of the same id resubmitted between that step and that
-- call (its take found the lock naming it, held already) would lose the lock to the late
-- delete, and a publish of another copy would then be accepted. So such a renew counts
-- one in KEYS[1]..':retaken' (same slot, the lock's expiry), and a 'free' by that task
-- while the count is above 0 takes one off it instead of deleting the lock. A count no
-- late delete was due for (a window's lock, which its copy's end keeps; a delete lost
-- when the store went away) keeps the lock past the copy's next point instead: a key
-- naming a copy past its point, which counts as free for every reader (it goes at its
-- expiry, or the next publish of the key takes it over), never a lock lost while its
-- copy waits.
-- Returns take and swap: {'', 0} when the task took the lock now, {'', 1} when it held it
-- already (an earlier publish of the same id: a refused step must not give it back), else
-- {the id holding it, the lock's PTTL} (how long ago it was taken: a holder whose record
-- does not exist yet may be between this take and its step); free and renew: ''.
local op, id = ARGV[1], ARGV[2]
local retaken = KEYS[1] .. ':retaken'
local holder = redis.call('GET', KEYS[1])
if op == 'free' then
  if holder == id then
    if tonumber(redis.call('HGET', retaken, 'n') or '0') > 0 then
      -- a hash's field: HINCRBY is in the documented ACL rule, DECR/INCRBY are not
      if redis.call('HINCRBY', retaken, 'n', -1) <= 0 then redis.call('DEL', retaken) end
    else
      redis.call('DEL', KEYS[1], retaken)
    end
  end
  return ''
end
local ms = tonumber(ARGV[3])
if op == 'renew' then
  if not holder then
    redis.call('SET', KEYS[1], id, 'PX', ms)
    redis.call('DEL', retaken)
  elseif holder == id then
    redis.call('SET', KEYS[1], id, 'PX', ms)
    if ARGV[4] ~= '1' then redis.call('HINCRBY', retaken, 'n', 1) end
    if redis.call('EXISTS', retaken) == 1 then redis.call('PEXPIRE', retaken, ms) end
  end
  return ''
end
if holder == id then return {'', 1} end
if holder and not (op == 'swap' and holder == ARGV[4]) then
  return {holder, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], id, 'PX', ms)
redis.call('DEL', retaken)
return {'', 0}
