-- fair.lua: fair shares in the global slot (the rules are _lib.lua's fair section).
-- ARGV[1] 'release' or 'take'.
--
-- release: the release pass (a worker's scheduler): each key visited gets its oldest parked
-- tasks released, as many as it has room for (cap - running - released), counted as
-- released until they start (or ARGV[2] ms pass: a release whose publish was lost stops
-- counting); the caller claims and publishes them as due. Keys visited in ARGV[3 ..]
-- (index members), KEYS[1] index, KEYS[2] caps, then per member: the name's lease set,
-- the key's running, parked and released sets. A key with nothing parked leaves the
-- index; the others go to its end (round robin). Returns {now ms, {released ids...} per
-- member}.
--
-- take (sharded layout, before the start step, as conc.lua): KEYS[1] the name's lease set,
-- KEYS[2..4] the key's running, parked, released sets, KEYS[5] index, KEYS[6] caps;
-- ARGV[2] lease ms, ARGV[3] cap, ARGV[4] task id, ARGV[5] index member. Returns 1 taken
-- now, 2 held already, 0 full (then parked, FIFO by the time it first was).
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
    fair_park(f, id, cap, now, now)
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
  return 1 + had
end

local release_ms = tonumber(ARGV[2])
local out = {}
local per = {}
for i = 3, #ARGV do
  local m = ARGV[i]
  local k = 3 + (i - 3) * 4
  local conc, c, p, r = KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3]
  redis.call('ZREMRANGEBYSCORE', conc, '-inf', now)
  redis.call('ZREMRANGEBYSCORE', r, '-inf', now)
  local cap = tonumber(redis.call('HGET', KEYS[2], m) or '') or 1
  local room = cap - fair_running(conc, c, now) - redis.call('ZCARD', r)
  local ids = {}
  if room > 0 then
    ids = redis.call('ZRANGE', p, 0, room - 1)
    for _, id in ipairs(ids) do
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
  per[#per + 1] = ids
end
out[1], out[2] = now, per
return out
