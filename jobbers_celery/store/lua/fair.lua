-- fair.lua: fair shares in the global slot (the rules are _lib.lua's fair section).
-- ARGV[1] 'release', 'place', 'take' or 'admit'.
--
-- release: the release pass (a worker's scheduler): each key visited gets its oldest parked
-- tasks released, as many as it has room for (cap - running - released), counted as
-- released until they start (or ARGV[2] ms pass: a release whose publish was lost stops
-- counting); the caller claims and publishes them as due. Keys visited in ARGV[3 ..]
-- (index members), KEYS[1] index, KEYS[2] caps, then per member: the name's lease set,
-- the key's running, parked and released sets. A key with nothing parked leaves the
-- index; the others go to its end (round robin). Returns {now ms, {released ids...} per
-- member, {their places (parked scores)...} per member}.
--
-- place (after a release, in the records' shard): KEYS the released tasks' records,
-- ARGV[2 ..] their places: written as the field fp of each record that exists, the place
-- a task parked again at its start gets back (_lib.lua's fair_place). Returns how many.
--
-- take (sharded layout, before the start step, as conc.lua): KEYS[1] the name's lease set,
-- KEYS[2..4] the key's running, parked, released sets, KEYS[5] index, KEYS[6] caps;
-- ARGV[2] lease ms, ARGV[3] cap, ARGV[4] task id, ARGV[5] index member, then (asked again
-- after a 3) ARGV[6], ARGV[7] the record's fp and sub_at ('' if none). Returns 1 taken
-- now, 2 held already, 0 full (then parked: at its place, fair_place, or where it is),
-- 3 full and not parked, without ARGV[6]: nothing done, the caller asks again with them.
--
-- admit (sharded layout, before a fair-share publish's step): the take's KEYS and ARGV[2]
-- the ms a publish counts as on its way to start, ARGV[3] cap, ARGV[4] task id, ARGV[5]
-- member. Returns 1 admitted (its message goes; counted on its way), 0 parked; plus 2 when
-- the id was counted already.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[1] == 'take' then
  local f = {c = KEYS[2], p = KEYS[3], r = KEYS[4], i = KEYS[5], caps = KEYS[6], m = ARGV[5]}
  local id, cap = ARGV[4], tonumber(ARGV[3])
  if redis.call('ZSCORE', KEYS[1], id) and redis.call('ZSCORE', f.c, id) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
    return 2
  end
  if fair_full(KEYS[1], f, id, cap, now) then
    if ARGV[6] == nil and not redis.call('ZSCORE', f.p, id) then return 3 end
    fair_park(f, id, cap, fair_place(ARGV[6], ARGV[7], now), now)
    return 0
  end
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), id)
  fair_start(f, id, now + tonumber(ARGV[2]))
  return 1
end

if ARGV[1] == 'admit' then
  local f = {c = KEYS[2], p = KEYS[3], r = KEYS[4], i = KEYS[5], caps = KEYS[6], m = ARGV[5]}
  -- + 2: the id was counted already (on its way or parked: an earlier publish of the same
  -- id), so a refused step must not withdraw it
  local had = (redis.call('ZSCORE', f.r, ARGV[4]) or redis.call('ZSCORE', f.p, ARGV[4]))
    and 2 or 0
  if fair_full(KEYS[1], f, ARGV[4], tonumber(ARGV[3]), now) then
    fair_park(f, ARGV[4], tonumber(ARGV[3]), now, now)
    return had
  end
  redis.call('ZADD', f.r, now + tonumber(ARGV[2]), ARGV[4])
  redis.call('ZREM', f.p, ARGV[4])  -- the head of the parked ones published (came due)
  return 1 + had
end

if ARGV[1] == 'place' then
  for i, task in ipairs(KEYS) do
    if redis.call('HGET', task, 'state') then  -- HGET: no HEXISTS in the ACL rule
      redis.call('HSET', task, 'fp', ARGV[i + 1])
    end
  end
  return #KEYS
end

local release_ms = tonumber(ARGV[2])
local out = {}
local per, places = {}, {}
for i = 3, #ARGV do
  local m = ARGV[i]
  local k = 3 + (i - 3) * 4
  local conc, c, p, r = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', r, '-inf', now)
  local cap = tonumber(redis.call('HGET', KEYS[2], m) or '') or 1
  local room = cap - fair_running(conc, c, now) - redis.call('ZCARD', r)
  local ids, at = {}, {}
  if room > 0 then
    local got = redis.call('ZRANGE', p, 0, room - 1, 'WITHSCORES')
    for j = 1, #got, 2 do
      local id = got[j]
      ids[#ids + 1], at[#at + 1] = id, got[j + 1]
      redis.call('ZREM', p, id)
      redis.call('ZADD', r, now + release_ms, id)
    end
  end
  if redis.call('ZCARD', p) == 0 then
    redis.call('ZREM', KEYS[1], m)
    redis.call('HDEL', KEYS[2], m)
  else
    redis.call('ZADD', KEYS[1], now, m)
  end
  per[#per + 1], places[#places + 1] = ids, at
end
out[1], out[2], out[3] = now, per, places
return out
